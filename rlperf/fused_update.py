"""The ``fused`` DQN update (``train.update``): one compiled call per gradient step for MLP Q-networks.

The torch update (:meth:`rlperf.dqn.Agent.update`, the ``torch`` form and the reference) runs ~120
aten operators per gradient step -- sample, three forwards, the target, the loss, backward, the
clip, Adam, the target lerp -- and on the CPU each pays the dispatcher's fixed cost: at a 2×64 MLP
and a batch of 128 that floor is most of the update. This module does the same step as loops and
BLAS calls compiled by numba (``cache=True``: only the first process compiles), in one call:

1. gather the batch from the replay's tensor storage through zero-copy numpy views, at the slots
   the storage's own generator drew (``torch.randint`` with the same generator and arguments as
   :meth:`~rlperf.buffer.ReplayBuffer.sample`, so both forms sample the same transitions), or from
   a batch a :class:`~rlperf.dqn.BatchSource` handed over (any other storage, the async learner);
2. the forwards: online on ``obs`` (kept for backward), online on ``next_obs`` to choose the next
   action (Double DQN; the target chooses when ``agent.double`` is off), target on ``next_obs``;
3. ``y = r + gamma (1 − done) Q_target(s', a*)``, Huber (``smooth_l1``, β = 1) or MSE, mean over the batch;
4. backward through the chosen action's output only, ReLU masks from the saved activations;
5. global-norm clipping as ``clip_grad_norm_`` (``coef = max / (norm + 1e-6)``, applied when < 1);
6. Adam as ``torch.optim.Adam`` (foreach form) computes it: the step counts (float32 tensors) + 1,
   ``m ← lerp(m, g, 1 − β1)``, ``v ← β2 v + (1 − β2) g²``, ``p ← p − lr/(1 − β1^t) · m / (√v / √(1 − β2^t) + ε)``
   with the bias corrections in float64 and the rest in float32;
7. the soft target update as ``torch._foreach_lerp_`` (``t + τ (o − t)``), or the hard copy.

Memory. Everything is written in place into the torch tensors' memory through numpy views: the
parameters (``param.data``), the target's, and the Adam state the torch optimizer holds
(``exp_avg``, ``exp_avg_sq``, ``step`` in ``optimizer.state``), so :meth:`~rlperf.dqn.Agent.act`,
``state_dict``, checkpoints and a resume under either form see the same tensors. Gradients and
activations live in scratch arrays allocated once; a call allocates nothing.

Arithmetic. The matrix products go to BLAS (numba's ``np.dot`` calls SciPy's, on the calling
thread's arrays, no copies: the transposes are layout flags); everything between them -- gather,
bias and ReLU, the target and the loss, the bias gradients, the ReLU masks, clipping, Adam, the
lerp -- is plain loops. Summation orders differ from torch's kernels, so the two forms agree to
float32 rounding, not bit for bit (``tests/test_fused_update.py`` states the tolerances).
"""

from __future__ import annotations

import functools
import time
from itertools import pairwise
from typing import TYPE_CHECKING, NoReturn

import numpy as np
import torch

from rlperf.env.fused import compile_notice
from rlperf.errors import ConfigError
from rlperf.lazy_dynamo import defer_dynamo

try:  # numba is a core dependency; resolve_update says why the torch form runs if this fails
    import numba
    from numba import njit
except Exception as exc:
    numba = None  # type: ignore[assignment]
    IMPORT_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    IMPORT_ERROR = None

if TYPE_CHECKING:
    from torch import nn

    from rlperf.config import Config

UPDATES = ("auto", "torch", "fused", "graph")
CLIP_EPS = 1e-6  # clip_grad_norm_'s guard against a zero norm


# Unlike the env kernel, compiled with numba's reference counting: ``np.dot(a, b, out)`` (BLAS
# through SciPy) returns ``out``, which numba only allows with it.


def _jit(fn):
    """Hot and small: inlined into the update at numba's IR level."""
    return njit(cache=True, inline="always")(fn) if numba is not None else fn


def _call(fn):
    return njit(cache=True)(fn) if numba is not None else fn


# ------------------------------------------------------------------------------------------------
# The network


def forward(weights, biases, acts):
    """The MLP on ``acts[0]``: ``acts[l + 1] = relu(acts[l] Wₗᵀ + bₗ)``, no ReLU on the last layer."""
    layers = len(biases)
    for layer in range(layers):
        b, out = biases[layer], acts[layer + 1]
        np.dot(acts[layer], weights[layer].T, out)
        relu = layer < layers - 1
        for r in range(out.shape[0]):
            for j in range(out.shape[1]):
                x = out[r, j] + b[j]
                out[r, j] = x if not relu or x > 0.0 else np.float32(0.0)


forward = _call(forward)


def argmax_row(q, r):
    """First index of the row's maximum (``torch.argmax``'s tie rule)."""
    best = 0
    for j in range(1, q.shape[1]):
        if q[r, j] > q[r, best]:
            best = j
    return best


argmax_row = _jit(argmax_row)


# ------------------------------------------------------------------------------------------------
# The update


def gather_rows(src, idx, dst, batch):
    width = src.shape[1]
    for r in range(batch):
        s = idx[r]
        for k in range(width):
            dst[r, k] = src[s, k]


gather_rows = _jit(gather_rows)


def adam_step(p, g, m, v, w1, b2, w2, bc2_sqrt, eps, step_size):
    """``torch.optim.Adam`` (foreach, no weight decay) on one flat tensor, in float32."""
    for i in range(p.shape[0]):
        gi = g[i]
        mi = m[i] + w1 * (gi - m[i])
        vi = v[i] * b2 + w2 * gi * gi
        m[i] = mi
        v[i] = vi
        p[i] = p[i] + step_size * (mi / (np.sqrt(vi) / bc2_sqrt + eps))


adam_step = _jit(adam_step)


def lerp_into(t, o, w):
    """``torch.lerp(t, o, w)`` in place, with torch's two formulas either side of ``w = 0.5``."""
    if w < 0.5:
        for i in range(t.shape[0]):
            t[i] = t[i] + w * (o[i] - t[i])
    else:
        one_minus = np.float32(1.0) - w
        for i in range(t.shape[0]):
            t[i] = o[i] - (o[i] - t[i]) * one_minus


lerp_into = _jit(lerp_into)


def loss_and_output_grad(idx, actions_s, rewards_s, dones_s, q, q_next, chosen, g_out, gamma, huber):
    """``y = r + gamma (1 − done) Q'(s', a*)``, the mean loss, and its gradient at the output (nonzero
    at the taken action only) into ``g_out``."""
    batch = idx.shape[0]
    one = np.float32(1.0)
    inv_batch = one / np.float32(batch)
    loss = 0.0
    for r in range(batch):
        s = idx[r]
        y = rewards_s[s] + gamma * (one - dones_s[s]) * q_next[r, chosen[r]]
        a = actions_s[s]
        d = q[r, a] - y
        for j in range(g_out.shape[1]):
            g_out[r, j] = 0.0
        if huber:
            ad = abs(d)
            loss += 0.5 * d * d if ad < 1.0 else ad - 0.5
            g_out[r, a] = (d if ad < one else (one if d > 0 else -one)) * inv_batch
        else:
            loss += d * d
            g_out[r, a] = np.float32(2.0) * d * inv_batch
    return np.float32(loss / batch)


loss_and_output_grad = _jit(loss_and_output_grad)


def backward(weights, acts, deltas, grads_w, grads_flat):
    """Layer by layer from the output's delta: ``dW = δᵀ h``, ``db = Σ δ``, ``δ_prev = (δ W) ⊙ [h > 0]``."""
    batch = acts[0].shape[0]
    for layer in range(len(weights) - 1, -1, -1):
        delta, h = deltas[layer], acts[layer]
        np.dot(delta.T, h, grads_w[layer])
        gb = grads_flat[2 * layer + 1]
        for j in range(gb.shape[0]):
            gb[j] = 0.0
        for r in range(batch):
            for j in range(gb.shape[0]):
                gb[j] += delta[r, j]
        if layer > 0:
            below = deltas[layer - 1]
            np.dot(delta, weights[layer], below)
            for r in range(batch):
                for k in range(below.shape[1]):
                    if h[r, k] <= 0.0:
                        below[r, k] = 0.0


backward = _jit(backward)


def clip_grads(grads_flat, clip):
    """``clip_grad_norm_``: scale every gradient by ``clip / (norm + 1e-6)`` when that is below 1."""
    total = 0.0
    for i in range(len(grads_flat)):
        g = grads_flat[i]
        for k in range(g.shape[0]):
            total += np.float64(g[k]) * np.float64(g[k])
    coef = clip / (np.float32(np.sqrt(total)) + np.float32(CLIP_EPS))
    if coef < np.float32(1.0):
        for i in range(len(grads_flat)):
            g = grads_flat[i]
            for k in range(g.shape[0]):
                g[k] *= coef


clip_grads = _jit(clip_grads)


def dqn_update(idx, obs_s, actions_s, rewards_s, next_s, dones_s,
               weights, biases, weights_flat, t_weights, t_biases, t_flat,
               grads_w, grads_flat, m_flat, v_flat, steps,
               acts, nacts, deltas, chosen,
               gamma, double, huber, clip, lr, beta1, beta2, eps, tau, target_mode):
    """One Double-DQN gradient step, in place; returns the mean loss.

    ``weights``/``biases`` are 2-D/1-D views of the online parameters, ``weights_flat`` the same
    parameters as a tuple of flat views in ``nn.Module.parameters()`` order (W₀, b₀, W₁, b₁, ...),
    matching ``grads_flat``, ``m_flat``, ``v_flat`` (Adam's moments) and ``steps`` (Adam's step
    counts, one-element views); ``t_*`` the target's. ``acts``/``nacts`` hold the layers' inputs and
    outputs for obs and next_obs, ``deltas[l]`` the loss's gradient at ``acts[l + 1]``.
    ``target_mode``: 0 none, 1 soft (lerp by ``tau``), 2 hard copy. Float scalars arrive as float32
    except ``lr``, ``beta1``, ``beta2`` (float64, as torch computes the bias corrections).
    """
    layers = len(biases)
    n_params = len(weights_flat)
    batch = idx.shape[0]
    # Forward on obs (kept for backward), then the next state's action and value.
    gather_rows(obs_s, idx, acts[0], batch)
    gather_rows(next_s, idx, nacts[0], batch)
    forward(weights, biases, acts)
    q_next = nacts[layers]
    if double:
        forward(weights, biases, nacts)
        for r in range(batch):
            chosen[r] = argmax_row(q_next, r)
        forward(t_weights, t_biases, nacts)
    else:
        forward(t_weights, t_biases, nacts)
        for r in range(batch):
            chosen[r] = argmax_row(q_next, r)
    loss = loss_and_output_grad(idx, actions_s, rewards_s, dones_s, acts[layers], q_next, chosen,
                                deltas[layers - 1], gamma, huber)
    backward(weights, acts, deltas, grads_w, grads_flat)
    if clip > 0.0:
        clip_grads(grads_flat, clip)
    for i in range(n_params):
        steps[i][0] += np.float32(1.0)
        t = np.float64(steps[i][0])
        bc1 = 1.0 - beta1 ** t
        bc2_sqrt = (1.0 - beta2 ** t) ** 0.5
        adam_step(weights_flat[i], grads_flat[i], m_flat[i], v_flat[i], np.float32(1.0 - beta1), np.float32(beta2),
                  np.float32(1.0 - beta2), np.float32(bc2_sqrt), eps, np.float32(-(lr / bc1)))
    if target_mode == 1:
        for i in range(n_params):
            lerp_into(t_flat[i], weights_flat[i], tau)
    elif target_mode == 2:
        for i in range(n_params):
            t_i, o = t_flat[i], weights_flat[i]
            for k in range(t_i.shape[0]):
                t_i[k] = o[k]
    return loss


dqn_update = _call(dqn_update)


def select(obs, weights, biases, acts, coins, epsilon, random, out):
    """ε-greedy over the MLP in one call: ``out[i] = random[i]`` where ``coins[i] < epsilon``, else the
    greedy action (``Agent.act``'s torch form, from the same draws)."""
    inp = acts[0]
    for r in range(obs.shape[0]):
        for k in range(obs.shape[1]):
            inp[r, k] = obs[r, k]
    forward(weights, biases, acts)
    q = acts[len(biases)]
    for r in range(q.shape[0]):
        out[r] = random[r] if coins[r] < epsilon else argmax_row(q, r)


select = _call(select)


# ------------------------------------------------------------------------------------------------
# The decision


def resolve_update(cfg: Config, device: torch.device) -> tuple[str, str]:
    """The ``train.update`` form that runs for ``cfg`` on ``device``, and why.

    ``auto`` takes ``fused`` wherever it runs -- the CPU, numba, an MLP Q-network (a 1-D
    observation) and the update knobs it implements (no ``train.amp``, ``train.compile``
    or ``train.grad_accum``) -- and ``torch`` elsewhere; an explicit ``fused`` that cannot run is a
    :class:`ConfigError`. Compiling (or loading) the update happens here, once per process and depth.
    """
    form = cfg.train.update
    if form not in UPDATES:
        raise ConfigError(f"train.update must be one of {', '.join(UPDATES)}, got {form!r}")
    if form == "torch":
        return "torch", "train.update=torch (the eager autograd reference)"
    if form == "graph" or (form == "auto" and device.type == "cuda"):
        why = why_not_graph(cfg, device)
        if why is None:
            source = "train.update=graph" if form == "graph" else "auto: a CUDA device"
            return "graph", f"{source} (the torch update captured once and replayed as one CUDA graph)"
        if form == "graph":
            raise ConfigError(f"train.update=graph cannot run: {why}", hint="use train.update=torch or auto")
        return "torch", f"auto: {why}"
    why = why_not_fused(cfg, device)
    if why is None:
        seconds, failure = compile_update(len(cfg.agent.hidden) + 1)
        if failure is None:
            source = "train.update=fused" if form == "fused" else "auto: an MLP update on the CPU with numba"
            return "fused", f"{source} (numba {numba.__version__}, compiled or loaded in {seconds:.2f} s)"
        why = failure
    if form == "fused":
        _refuse(why)
    return "torch", f"auto: {why}"


def check_update(cfg: Config, device: torch.device) -> None:
    """Refuse an explicit ``train.update=fused`` or ``graph`` that cannot run, before anything
    starts. Without compiling: the first compile loads SciPy's BLAS, whose thread count is fixed
    when it loads, so that waits for the Agent, after ``run.threads`` applies."""
    if cfg.train.update == "fused" and (why := why_not_fused(cfg, device)) is not None:
        _refuse(why)
    if cfg.train.update == "graph" and (why := why_not_graph(cfg, device)) is not None:
        raise ConfigError(f"train.update=graph cannot run: {why}", hint="use train.update=torch or auto")


def why_not_graph(cfg: Config, device: torch.device) -> str | None:
    """Why the CUDA-graph update (:mod:`rlperf.graph_update`) cannot run this config, or None."""
    if device.type != "cuda":
        return f"the CUDA-graph update needs a CUDA device, and the device is {device}"
    return _eager_knob(cfg, "graph")


def _eager_knob(cfg: Config, form: str) -> str | None:
    """The update knob only the eager torch update implements, that keeps ``form`` from running."""
    t = cfg.train
    if t.amp != "off":
        return f"train.amp={t.amp} runs the update under autocast, which the {form} update (float32) does not"
    if t.compile != "off":
        return f"train.compile={t.compile} compiles the torch update"
    if t.grad_accum != 1:
        return f"train.grad_accum={t.grad_accum} accumulates micro-batches, which the {form} update does not"
    return None


def _refuse(why: str) -> NoReturn:
    hint = ("pip install numba scipy, or use train.update=torch" if "numba" in why else
            "use train.update=torch or auto (docs/bottlenecks.md §20)")
    raise ConfigError(f"train.update=fused cannot run: {why}", hint=hint)


def why_not_fused(cfg: Config, device: torch.device) -> str | None:
    """Why the fused update cannot run this config, or None."""
    if device.type != "cpu":
        return (f"the fused update runs on the CPU, and the device is {device} (there the fast form is the "
                "CUDA-graph update: train.update=graph)")
    if IMPORT_ERROR is not None:
        return f"numba does not import ({IMPORT_ERROR})"
    if (why := _eager_knob(cfg, "fused")) is not None:
        return why
    from rlperf.env.backends import env_spec

    obs_shape, _ = env_spec(cfg)
    if len(obs_shape) != 1:
        return f"the observation {obs_shape} makes the Q-network a CNN; the fused update takes MLPs"
    return None


@functools.cache
def compile_update(layers: int) -> tuple[float, str | None]:
    """Compile (or load from numba's cache) the update and the fused selection for ``layers`` linear
    layers by running them once on a tiny problem; (seconds, None), or (seconds, why it failed)."""
    t0 = time.perf_counter()
    if numba is None:
        return 0.0, f"numba does not import ({IMPORT_ERROR})"
    try:
        widths = [3] + [2] * (layers - 1) + [3]
        # The tiny networks' initialisation must not draw from the run's generator: this runs once per
        # process (cached), so a draw here would make a resumed run's RNG differ from an uninterrupted one.
        with torch.random.fork_rng(devices=[]):
            net, target = _tiny_mlp(widths), _tiny_mlp(widths)
        defer_dynamo()
        problem = FusedUpdate(net, target, torch.optim.Adam(net.parameters()), batch_size=2)
        storage = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.int64), torch.zeros(4), torch.zeros(4, 3),
                   torch.zeros(4))
        with compile_notice(f"the fused update ({layers} layers)"):
            problem.step(storage, torch.tensor([0, 1]), gamma=0.9, double=True, huber=True, clip=1.0, target_mode=1,
                         tau=0.5)
            # Selection too, so that the first step compiles nothing (and the notice counts it).
            problem.act(torch.zeros(2, 3), torch.zeros(2), 0.5, torch.zeros(2, dtype=torch.int64))
    except Exception as exc:  # pragma: no cover - depends on the install
        return time.perf_counter() - t0, f"numba could not compile the fused update ({type(exc).__name__}: {exc})"
    return time.perf_counter() - t0, None


def _tiny_mlp(widths: list[int]) -> nn.Module:
    from torch import nn

    layers: list[nn.Module] = []
    for a, b in pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


# ------------------------------------------------------------------------------------------------
# The views


class FusedUpdate:
    """The numpy views and scratch arrays one Q-network's fused update runs on.

    ``q`` and ``target`` are MLPs (``Linear`` layers, ReLU between); ``optimizer`` is the
    ``torch.optim.Adam`` over ``q``'s parameters, whose state this creates where it is empty (as its
    first ``step`` would) and reads through views. :meth:`refresh` re-reads the views after anything
    replaced the tensors (``optimizer.load_state_dict`` does).
    """

    def __init__(self, q: nn.Module, target: nn.Module, optimizer: torch.optim.Optimizer, batch_size: int) -> None:
        self.q, self.target, self.optimizer, self.batch_size = q, target, optimizer, batch_size
        group = optimizer.param_groups[0]
        if len(optimizer.param_groups) != 1 or group["weight_decay"] != 0 or group["amsgrad"] or group["maximize"]:
            raise ValueError("the fused update implements Adam with one parameter group, no weight decay, amsgrad "
                             "or maximize")
        self.params = list(q.parameters())
        weights = self.params[0::2]
        widths = [w.shape[1] for w in weights] + [weights[-1].shape[0]]
        # Scratch: the layers' inputs and outputs for obs (kept for backward) and next_obs, the
        # deltas, and the gradients (2-D weight views share memory with the flat form).
        self.acts = tuple(np.zeros((batch_size, w), dtype=np.float32) for w in widths)
        self.nacts = tuple(np.zeros((batch_size, w), dtype=np.float32) for w in widths)
        self.deltas = tuple(np.zeros((batch_size, w), dtype=np.float32) for w in widths[1:])
        self.grads_flat = tuple(np.zeros(p.numel(), dtype=np.float32) for p in self.params)
        self.grads_w = tuple(self.grads_flat[2 * i].reshape(w.shape) for i, w in enumerate(weights))
        self.chosen = np.zeros(batch_size, dtype=np.int64)
        self.arange = torch.arange(batch_size)
        self._select_acts: tuple[np.ndarray, ...] | None = None  # act's scratch, sized on its first call
        self.refresh()

    def refresh(self) -> None:
        """(Re-)read the views of the parameters, the target and the Adam state (creating it if empty)."""
        for p in self.params:
            state = self.optimizer.state[p]
            if not state:  # what Adam's first step would create (its _init_group)
                state["step"] = torch.tensor(0.0, dtype=torch.float32)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        t_params = list(self.target.parameters())
        self.weights = tuple(p.data.numpy() for p in self.params[0::2])
        self.biases = tuple(p.data.numpy() for p in self.params[1::2])
        self.weights_flat = tuple(p.data.view(-1).numpy() for p in self.params)
        self.t_weights = tuple(p.data.numpy() for p in t_params[0::2])
        self.t_biases = tuple(p.data.numpy() for p in t_params[1::2])
        self.t_flat = tuple(p.data.view(-1).numpy() for p in t_params)
        states = [self.optimizer.state[p] for p in self.params]
        self.m_flat = tuple(s["exp_avg"].view(-1).numpy() for s in states)
        self.v_flat = tuple(s["exp_avg_sq"].view(-1).numpy() for s in states)
        self.steps = tuple(s["step"].view(1).numpy() for s in states)

    def act(self, obs: torch.Tensor, coins: torch.Tensor, epsilon: float, random: torch.Tensor) -> torch.Tensor:
        """ε-greedy actions for ``obs`` (float32, contiguous, on the CPU) from the draws ``coins`` and
        ``random``; a fresh tensor, as ``torch.where`` returns."""
        n = obs.shape[0]
        if self._select_acts is None or self._select_acts[0].shape[0] != n:
            self._select_acts = tuple(np.zeros((n, a.shape[1]), dtype=np.float32) for a in self.acts)
        out = torch.empty(n, dtype=torch.int64)
        select(obs.numpy(), self.weights, self.biases, self._select_acts, coins.numpy(), np.float32(epsilon),
               random.numpy(), out.numpy())
        return out

    def step(self, fields: tuple[torch.Tensor, ...], idx: torch.Tensor, *, gamma: float, double: bool, huber: bool,
             clip: float, target_mode: int, tau: float) -> float:
        """One update on the transitions at slots ``idx`` of ``fields`` (obs, actions, rewards,
        next_obs, dones: CPU tensors, the replay's ring or a sampled batch); the mean loss. Adam's
        lr, betas and eps are the optimizer's own (its param group), as its ``step`` would read them."""
        obs, actions, rewards, next_obs, dones = (f.numpy() for f in fields)
        group = self.optimizer.param_groups[0]
        (beta1, beta2), eps = group["betas"], group["eps"]
        return float(dqn_update(
            idx.numpy(), obs, actions, rewards, next_obs, dones,
            self.weights, self.biases, self.weights_flat, self.t_weights, self.t_biases, self.t_flat,
            self.grads_w, self.grads_flat, self.m_flat, self.v_flat, self.steps,
            self.acts, self.nacts, self.deltas, self.chosen,
            np.float32(gamma), double, huber, np.float32(clip), float(group["lr"]), beta1, beta2, np.float32(eps),
            np.float32(tau), target_mode))
