"""DQN on the batched Snake: the Q-network, the update, and the hot loop.

The loop (:func:`run_loop`) is one function that reads top to bottom, one phase block per step:
select -> step -> push -> train -> log. Everything a knob switches (push loop/batch, list/numpy/
tensor storage, hard/soft target, grad/no_grad inference, log_every, AMP, compile, grad
accumulation, GC) is decided once, before the loop, so the loop itself stays the same for every
config and the phase timer measures what the knob changed.

Host synchronisation: in the fast configuration on CUDA nothing in select/step/push/train reads a
device value on the host. Losses and finished episodes are accumulated on the device and read in
the log phase, every ``train.log_every`` vector steps. On the CPU, where reading a value costs
nothing, finished episodes are read every step so that ``--episodes N`` stops on time.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib
import math
import shutil
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from rlperf.buffer import Batch, ReplayBuffer
from rlperf.config import Config
from rlperf.env.vector import N_ACTIONS
from rlperf.errors import ConfigError
from rlperf.fused_update import FusedUpdate, check_update, resolve_update
from rlperf.graph_update import GraphStep, capturable_adam
from rlperf.lazy_dynamo import defer_dynamo
from rlperf.score import first_reached_each, target_key
from rlperf.timers import PhaseTimer



class QNetwork(nn.Module):
    """An MLP over feature vectors, or a small CNN over ``(3, size, size)`` grid planes."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, hidden: list[int]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        if len(obs_shape) == 1:
            width = obs_shape[0]
        else:
            channels, height, width_px = obs_shape
            layers += [
                nn.Conv2d(channels, 32, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(32, 64, 3, padding=1),
                nn.ReLU(),
                nn.Flatten(),
            ]
            width = 64 * height * width_px
        for size in hidden:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        layers.append(nn.Linear(width, n_actions))
        self.net = nn.Sequential(*layers)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def check_knobs(cfg: Config, device: torch.device) -> None:
    """Refuse, with one line each, the knob values that cannot apply on ``device``."""
    check_update(cfg, device)
    train = cfg.train
    if train.amp == "fp16" and device.type != "cuda":
        raise ConfigError(
            "train.amp=fp16 needs a CUDA device (GradScaler + float16 autocast)", hint="use train.amp=bf16 or off on the CPU"
        )
    if train.amp == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(
            f"train.amp=bf16 is not supported by {torch.cuda.get_device_name(device)}", hint="use train.amp=fp16"
        )
    if train.compile in ("reduce-overhead", "max-autotune") and device.type != "cuda":
        raise ConfigError(
            f"train.compile={train.compile} relies on CUDA graphs / GPU autotuning",
            hint="use train.compile=default on the CPU",
        )
    if train.compile in ("default", "reduce-overhead", "max-autotune"):
        try:
            # By name: an ``import torch._inductor`` statement here would make ``torch`` a local
            # name of this whole function (the bf16 check above would then fail on CUDA).
            importlib.import_module("torch._inductor")
        except Exception as exc:  # pragma: no cover - depends on the install
            raise ConfigError(f"train.compile={train.compile} needs torch.compile's inductor backend: {exc}") from None
        if device.type == "cpu" and not any(shutil.which(cc) for cc in ("cc", "gcc", "clang", "g++")):
            raise ConfigError(
                "train.compile on the CPU needs a C++ compiler (none found on PATH)",
                hint="install gcc or use train.compile=off",
            )


def eps_decay_steps(cfg: Config) -> int:
    """Env transitions over which ε decays: ``agent.eps_decay_fraction`` of ``train.steps`` when the
    run stops on env steps and the fraction is set (Stable-Baselines3's ``exploration_fraction``),
    else ``agent.eps_decay_steps`` (a run that stops on episodes has no known length)."""
    a, t = cfg.agent, cfg.train
    if a.eps_decay_fraction > 0 and t.steps > 0:
        return max(1, round(a.eps_decay_fraction * t.steps))
    return a.eps_decay_steps


def epsilon_at(cfg: Config, env_steps: int) -> float:
    """Linear ε decay over env transitions (:func:`eps_decay_steps`), from ``eps_start`` to ``eps_end``."""
    a = cfg.agent
    fraction = min(1.0, env_steps / eps_decay_steps(cfg))
    return a.eps_start + fraction * (a.eps_end - a.eps_start)


class BatchSource(Protocol):
    """What an update samples from: a :class:`~rlperf.buffer.ReplayBuffer`, or the async learner's
    view of the shared replay."""

    def sample(self, batch_size: int) -> Batch: ...


class Agent:
    """Online and target Q-networks, the optimizer, and the update with its knobs.

    Every knob of the update is decided here, once: the forward functions (``train.compile``), the
    autocast and gradient scaler (``train.amp``), the loss, the Double-DQN action chooser, gradient
    clipping, the target update (``agent.target_update``) and the context action selection runs in
    (``agent.inference``). :meth:`act` and :meth:`update` then run the same code for every config.

    ``train.update`` picks the form of :meth:`update` (:func:`rlperf.fused_update.resolve_update`):
    the torch one below, or one compiled call (:class:`rlperf.fused_update.FusedUpdate`) writing into
    the same parameters and the same Adam state; with ``agent.inference=no_grad`` the fused form
    selects actions with one compiled call too (:meth:`act`).
    """

    def __init__(self, cfg: Config, obs_shape: tuple[int, ...], device: torch.device, n_actions: int = N_ACTIONS) -> None:
        a, t = cfg.agent, cfg.train
        self.device = device
        self.n_actions = n_actions
        self.q = QNetwork(obs_shape, n_actions, list(a.hidden)).to(device)
        self.target = copy.deepcopy(self.q).requires_grad_(False)
        self.update_form: tuple[str, str] = resolve_update(cfg, device)
        """The ``train.update`` form :meth:`update` runs, and why."""
        fused = device.type == "cuda"
        defer_dynamo()  # building Adam would import torch._dynamo (over a second) for nothing
        if self.update_form[0] == "graph":
            self.optimizer = capturable_adam(list(self.q.parameters()), a.lr)
        else:
            self.optimizer = torch.optim.Adam(self.q.parameters(), lr=a.lr, fused=fused, foreach=None if fused else True)
        self.gamma = a.gamma
        self.batch_size = cfg.buffer.batch_size
        self.grad_accum = t.grad_accum
        self.updates = 0
        self.generator = torch.Generator(device=device)
        self.generator.manual_seed(cfg.run.seed + 1)
        self._q_params: list[torch.Tensor] = list(self.q.parameters())
        self._target_params: list[torch.Tensor] = list(self.target.parameters())

        self.forward, self.target_forward = self._compiled(t.compile)
        # The Q-network has no dropout or batch norm, so train and eval mode compute the same thing:
        # what the knob switches is whether autograd records a graph during action selection.
        # A module compiled with CUDA graphs (reduce-overhead, max-autotune) must not be first called
        # under inference_mode and then trained: the graph's static inputs would be inference tensors,
        # which autograd refuses to save. no_grad records no graph either and mixes with training.
        graphs = t.compile in ("reduce-overhead", "max-autotune") or self.update_form[0] == "graph"
        no_grad = torch.no_grad if graphs else torch.inference_mode
        self._inference: Callable[[], contextlib.AbstractContextManager[Any]] = (
            no_grad if a.inference == "no_grad" else contextlib.nullcontext
        )
        amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(t.amp)
        self._autocast: Callable[[], contextlib.AbstractContextManager[Any]] = (
            (lambda: torch.autocast(device.type, dtype=amp_dtype)) if amp_dtype else contextlib.nullcontext
        )
        self.scaler = torch.amp.GradScaler(device.type) if t.amp == "fp16" else None
        self._loss = F.smooth_l1_loss if a.huber else F.mse_loss
        self._chooser = self.forward if a.double else self.target_forward
        self._clip = a.grad_clip
        self._tau = a.tau
        self._target_every = a.target_every
        self._update_target = self._soft_update if a.target_update == "soft" else self._hard_update
        self._double, self._huber, self._hard = a.double, a.huber, a.target_update == "hard"
        self._bind_update(a.inference == "no_grad")

    def _bind_update(self, no_grad: bool) -> None:
        """Wire :meth:`update` (and, where it has one, selection) to the form ``update_form`` names."""
        self._fused: FusedUpdate | None = None
        self._update: Callable[[BatchSource], torch.Tensor] = self._update_torch
        if self.update_form[0] == "fused":
            self._fused = FusedUpdate(self.q, self.target, self.optimizer, self.batch_size)
            self._update = self._update_fused
        self._graph: GraphStep | None = None
        self._select_graph: GraphStep | None = None
        if self.update_form[0] == "graph":
            self._graph = GraphStep(self._graph_body, prepare=lambda: self.optimizer.zero_grad(set_to_none=True))
            if no_grad:  # agent.inference=grad records a graph per selection: kept eager
                self._select_graph = GraphStep(lambda obs: self.forward(obs).argmax(1))
            self._update = self._update_graph
        self._slots = torch.empty(self.batch_size, dtype=torch.int64)
        self._fused_loss = torch.zeros(())
        self._fused_loss_view = self._fused_loss.numpy()  # written without a dispatch
        # Selection goes through the fused forward too where the update is fused and selection
        # records no graph anyway (agent.inference=grad is a slow form of its own, §8).
        self._fused_select = self._fused is not None and no_grad

    def _compiled(self, mode: str) -> tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]]:
        if mode == "off":
            return self.q, self.target
        if mode == "jit":
            return torch.jit.script(self.q), torch.jit.script(self.target)
        return torch.compile(self.q, mode=mode), torch.compile(self.target, mode=mode)

    def act(self, obs: torch.Tensor, epsilon: float) -> torch.Tensor:
        """Per-board ε-greedy on the device: each board flips its own coin. Under the fused update
        with ``agent.inference=no_grad``, the forward, argmax and choice are one compiled call
        (:meth:`FusedUpdate.act`) on the same draws."""
        n = obs.shape[0]
        if self._fused_select and obs.dtype == torch.float32 and obs.is_contiguous():
            assert self._fused is not None
            coins = torch.rand(n, generator=self.generator, device=self.device)
            random = torch.randint(0, self.n_actions, (n,), generator=self.generator, device=self.device)
            return self._fused.act(obs, coins, epsilon, random)
        with self._inference():
            graph = self._select_graph
            if graph is not None and (graph.graph is None or graph.shape == obs.shape):
                greedy = graph(obs)
            else:
                greedy = self.forward(obs).argmax(1)
            explore = torch.rand(n, generator=self.generator, device=self.device) < epsilon
            random = torch.randint(0, self.n_actions, (n,), generator=self.generator, device=self.device)
            return torch.where(explore, random, greedy)

    def update(self, buffer: BatchSource) -> torch.Tensor:
        """One gradient step of Double DQN (Huber loss) over ``grad_accum`` micro-batches; the mean
        loss as a 0-d tensor on the device (reading it is the caller's host sync). Under the fused
        form the tensor is the same one every call: read it before the next update."""
        return self._update(buffer)

    def _update_fused(self, buffer: BatchSource) -> torch.Tensor:
        """The fast form: one compiled call, gathering from the replay's ring where it is CPU tensors."""
        assert self._fused is not None
        sample_slots = getattr(buffer, "sample_slots", None)
        fields = sample_slots(self._slots) if sample_slots is not None else None
        if fields is not None:
            slots = self._slots
        else:  # another storage, or the async learner's staged batch: the batch is the ring
            fields, slots = tuple(buffer.sample(self.batch_size)), self._fused.arange
        # The hard copy comes after the update that makes ``updates`` a multiple of target_every.
        target_mode = (2 if (self.updates + 1) % self._target_every == 0 else 0) if self._hard else 1
        loss = self._fused.step(fields, slots, gamma=self.gamma, double=self._double, huber=self._huber,
                                clip=self._clip, target_mode=target_mode, tau=self._tau)
        self.updates += 1
        self._fused_loss_view[()] = loss
        return self._fused_loss

    def _update_graph(self, buffer: BatchSource) -> torch.Tensor:
        """The fast form on CUDA: the batch copied into the graph's inputs, one replay
        (:mod:`rlperf.graph_update`); the hard target copy, every ``target_every`` updates, stays eager."""
        assert self._graph is not None
        b = buffer.sample(self.batch_size)
        loss = self._graph(b.obs, b.actions, b.rewards, b.next_obs, b.dones)
        self.updates += 1
        if self._hard:
            self._hard_update()
        return loss

    def _graph_body(self, obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor, next_obs: torch.Tensor,
                    dones: torch.Tensor) -> torch.Tensor:
        """What the graph captures: :meth:`_update_torch` with one micro-batch and no autocast."""
        q = self.forward(obs).gather(1, actions.unsqueeze(1)).squeeze(1)
        with torch.no_grad():
            next_actions = self._chooser(next_obs).argmax(1, keepdim=True)
            next_q = self.target_forward(next_obs).gather(1, next_actions).squeeze(1)
            y = rewards + self.gamma * (1.0 - dones) * next_q
        loss = self._loss(q, y)
        loss.backward()
        if self._clip > 0:
            nn.utils.clip_grad_norm_(self._q_params, self._clip, foreach=True)
        self.optimizer.step()
        if not self._hard:
            self._soft_update()
        return loss.detach()

    def _update_torch(self, buffer: BatchSource) -> torch.Tensor:
        """The slow form and the reference: eager autograd, one dispatch per operator."""
        self.optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        for _ in range(self.grad_accum):
            b = buffer.sample(self.batch_size)
            with self._autocast():
                q = self.forward(b.obs).gather(1, b.actions.unsqueeze(1)).squeeze(1).float()
                with torch.no_grad():
                    next_actions = self._chooser(b.next_obs).argmax(1, keepdim=True)
                    next_q = self.target_forward(b.next_obs).gather(1, next_actions).squeeze(1).float()
                    # Termination does not bootstrap; truncation does (dones holds terminations only).
                    y = b.rewards + self.gamma * (1.0 - b.dones) * next_q
                loss = self._loss(q, y) / self.grad_accum
            (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            total += loss.detach()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self._clip > 0:
            nn.utils.clip_grad_norm_(self._q_params, self._clip, foreach=True)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.updates += 1
        self._update_target()
        return total

    @torch.no_grad()
    def _soft_update(self) -> None:
        """The fast form: an in-place lerp of every target weight towards the online one."""
        torch._foreach_lerp_(self._target_params, self._q_params, self._tau)

    @torch.no_grad()
    def _hard_update(self) -> None:
        """The slow form (docs/bottlenecks.md §7): a full state-dict copy every ``target_every`` updates."""
        if self.updates % self._target_every == 0:
            self.target.load_state_dict(self.q.state_dict())

    def state_dict(self) -> dict[str, Any]:
        return {
            "q": self.q.state_dict(),
            "target": self.target.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "updates": self.updates,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.q.load_state_dict(state["q"])
        self.target.load_state_dict(state["target"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.updates = state["updates"]
        self.generator.set_state(state["generator"])
        if self._fused is not None:  # the optimizer's state tensors were replaced
            self._fused.refresh()
        if self._graph is not None:  # likewise: the captured update read the old ones
            self._graph.reset()


class EpisodeLog:
    """Finished episodes, copied on the device every step and read on the host when flushed."""

    def __init__(self, rows: int, num_envs: int, device: torch.device) -> None:
        self.done = torch.zeros((rows, num_envs), dtype=torch.bool, device=device)
        self.score = torch.zeros((rows, num_envs), dtype=torch.float32, device=device)  # fruits, or a return
        self.length = torch.zeros((rows, num_envs), dtype=torch.int64, device=device)
        self.ret = torch.zeros((rows, num_envs), dtype=torch.float32, device=device)
        self.filled = 0

    def record(self, infos: dict[str, Any]) -> None:
        row, episode = self.filled, infos["final_info"]
        self.done[row].copy_(infos["_final_info"])
        self.score[row].copy_(episode["score"])
        self.length[row].copy_(episode["steps"])
        self.ret[row].copy_(episode["return"])
        self.filled += 1

    @property
    def full(self) -> bool:
        return self.filled == self.done.shape[0]

    def flush(self, env_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
        """Scores, lengths, returns and end env steps of the episodes finished since the last flush (a
        host sync; ends None: all at ``env_steps``, the count after the last recorded vector step)."""
        k = self.filled
        self.filled = 0
        done = self.done[:k].cpu().numpy()
        # One row (every flush on the CPU): every episode ended at this step, no array to build.
        ends = None if k == 1 else env_steps - (k - 1 - np.nonzero(done)[0]) * done.shape[1]
        return (self.score[:k].cpu().numpy()[done], self.length[:k].cpu().numpy()[done],
                self.ret[:k].cpu().numpy()[done], ends)


@dataclass
class Progress:
    """Counters and learning statistics of a run, all host values (what the record reports)."""

    vector_steps: int = 0
    env_steps: int = 0
    updates: int = 0
    episodes: int = 0
    owed_updates: float = 0.0
    best_score: int | float = 0
    episode_steps: int = 0  # env steps of the episodes whose length was read (the sum of their lengths)
    lengths_read: int = 0  # how many episodes that is (async mode may drop some: not always ``episodes``)
    scores: deque = field(default_factory=lambda: deque(maxlen=100))
    returns: deque = field(default_factory=lambda: deque(maxlen=100))
    last_loss: float = float("nan")
    epsilon: float = 1.0
    status: str = "running"
    # The mean loss's accumulator between two log phases: summed on the model's device so the hot
    # loop never reads it, and kept here (not in run_loop) so a checkpoint carries it across a resume.
    loss_sum: torch.Tensor | None = None
    loss_count: int = 0
    # Time to score (rlperf.score): the targets of train.score_targets, and for each one reached
    # (by its target_key) the clock and counters of the read in which it was first reached.
    score_targets: tuple[float, ...] = ()
    time_to_score: dict[str, dict[str, float | int]] = field(default_factory=dict)
    # The episodes read since the log phase last took them (take_episodes), as (end env steps or one
    # step for all, returns, lengths): TensorBoard's point per episode, written at log time. Kept as
    # given, so the loop only appends a tuple. Not checkpointed.
    new_episodes: list[tuple[np.ndarray | int, np.ndarray, np.ndarray]] = field(default_factory=list)

    def add_episodes(self, scores: np.ndarray, lengths: np.ndarray, returns: np.ndarray,
                     ends: np.ndarray | None = None, clock: Callable[[], Mapping[str, float | int]] | None = None) -> None:
        """Take finished episodes in. ``ends``: the env step each one ended at (None: this read's).
        ``clock`` (the read's wall seconds and counters) is called only when a score target is reached
        in them; without it targets are not checked."""
        unreached = [t for t in self.score_targets if target_key(t) not in self.time_to_score] if clock else []
        hits = first_reached_each(self.scores, scores, unreached) if unreached else []
        read_before = self.lengths_read
        self.episodes += len(scores)
        self.episode_steps += int(lengths.sum())
        self.lengths_read += len(lengths)
        self.scores.extend(scores.tolist())
        self.returns.extend(returns.tolist())
        if len(scores):
            self.new_episodes.append((self.env_steps if ends is None else ends, returns, lengths))
            best = float(scores.max())
            self.best_score = max(self.best_score, int(best) if best.is_integer() else best)
        for target, index in zip(unreached, hits, strict=True):
            if index is not None:
                assert clock is not None
                self.time_to_score[target_key(target)] = {**clock(), "episodes": read_before + index + 1}

    def take_episodes(self) -> list[tuple[np.ndarray | int, np.ndarray, np.ndarray]]:
        """The episodes read since the last take, as read: (end env steps or one step for all,
        returns, lengths) per read. Nothing is built here: a run without TensorBoard only drops them."""
        taken, self.new_episodes = self.new_episodes, []
        return taken

    @property
    def mean_score(self) -> float:
        return float(np.mean(self.scores)) if self.scores else float("nan")

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def state_dict(self) -> dict[str, Any]:
        """Plain values and CPU tensors (loadable with ``torch.load(weights_only=True)``)."""
        state = dict(self.__dict__)
        del state["new_episodes"]
        state["scores"], state["returns"] = list(self.scores), list(self.returns)
        state["score_targets"] = list(self.score_targets)
        state["time_to_score"] = {k: dict(v) for k, v in self.time_to_score.items()}
        if self.loss_sum is not None:
            state["loss_sum"] = self.loss_sum.detach().to("cpu", copy=True)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in state.items():
            if key in ("scores", "returns"):
                value = deque(value, maxlen=100)
            elif key == "score_targets":
                value = tuple(value)
            setattr(self, key, value)
        self.status = "running"


@contextlib.contextmanager
def gc_mode(mode: str) -> Iterator[None]:
    """The ``train.gc`` knob: leave the collector on, freeze what exists, or switch it off."""
    if mode == "on":
        yield
        return
    gc.collect()
    if mode == "freeze":
        gc.freeze()  # everything alive now moves to a generation the collector never scans
        try:
            yield
        finally:
            gc.unfreeze()
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def stop_reached(cfg: Config, p: Progress, since: Mapping[str, int] | None = None) -> bool:
    """Whether the run did ``train.episodes`` episodes or ``train.steps`` env steps, counted from the
    start or from the counts in ``since`` (``rlperf profile`` counts from the end of its warm-up)."""
    t = cfg.train
    episodes, steps = (p.episodes, p.env_steps) if since is None else (
        p.episodes - since["episodes"], p.env_steps - since["env_steps"])
    return (t.episodes > 0 and episodes >= t.episodes) or (t.steps > 0 and steps >= t.steps)


def steps_before_learning(cfg: Config) -> int:
    """Vector steps that only fill the replay: the first gradient update comes in the next one."""
    learning_starts = max(cfg.train.learning_starts, cfg.buffer.batch_size)
    return max(0, math.ceil(learning_starts / cfg.env.num_envs) - 1)


def pay_updates(agent: Agent, buffer: ReplayBuffer, progress: Progress, loss_sum: torch.Tensor,
                should_stop: Callable[[], bool]) -> None:
    """The gradient updates ``progress`` owes, their losses summed into ``loss_sum``. A stop request
    is checked between two updates: one vector step can hold thousands (a large ``train_ratio``), and
    Ctrl-C must not wait for them all. What is still owed stays in ``progress`` (and so in the
    checkpoint), and :func:`run_loop` pays it first when the run resumes."""
    while progress.owed_updates >= 1.0 and not should_stop():
        progress.owed_updates -= 1.0
        loss_sum += agent.update(buffer)
        progress.loss_count += 1
    progress.updates = agent.updates


def read_mean_loss(progress: Progress, loss_sum: torch.Tensor, log_boundary: bool) -> None:
    """The interval's mean loss into ``progress`` (a host read); a non-finite one marks the run diverged."""
    if not progress.loss_count:
        return
    progress.last_loss = float(loss_sum) / progress.loss_count
    # The interval goes on past a run's last step that is not a log boundary: a resume that
    # extends the run logs the same mean as one uninterrupted run.
    if log_boundary:
        loss_sum.zero_()
        progress.loss_count = 0
    if not math.isfinite(progress.last_loss):
        progress.status = "diverged"


def run_loop(
    cfg: Config,
    env: Any,
    agent: Agent,
    buffer: ReplayBuffer,
    timer: PhaseTimer,
    progress: Progress,
    obs: torch.Tensor,
    on_log: Callable[[Progress], None],
    should_stop: Callable[[], bool] = lambda: False,
    on_step: Callable[[], None] | None = None,
    done: Callable[[Progress], bool] | None = None,
    run_wall: Callable[[], float] | None = None,
) -> torch.Tensor:
    """Train until the stop condition; returns the last observation (the env's state for a resume).

    ``on_log`` is called in the log phase every ``train.log_every`` vector steps, after the host
    has read the finished episodes and the mean loss into ``progress``; ``should_stop`` (signals) is
    checked at each vector-step boundary and between two gradient updates (:func:`pay_updates`), and
    ``on_step`` (instruments, periodic checkpoints) is called at each vector-step boundary;
    ``done`` replaces the config's stop condition (:func:`stop_reached`) where given; ``run_wall``
    gives the seconds since the run's start for the time to score (rlperf.score), which is checked
    where finished episodes are read: every step on the CPU, every log interval elsewhere.
    Everything that shapes the rest of the run lives in ``agent``, ``buffer``, ``env`` (with the
    returned observation) and ``progress``, so a run checkpointed at a boundary resumes exactly.
    """
    t = cfg.train
    n = env.num_envs
    flush_every = 1 if agent.device.type == "cpu" else t.log_every
    episodes = EpisodeLog(flush_every, n, agent.device)
    learning_starts = max(t.learning_starts, cfg.buffer.batch_size)
    if progress.loss_sum is None:
        progress.loss_sum = torch.zeros((), device=agent.device)
    else:  # resumed: the accumulator comes back from the checkpoint on the CPU
        progress.loss_sum = progress.loss_sum.to(agent.device)
    loss_sum = progress.loss_sum
    finished = done if done is not None else (lambda p: stop_reached(cfg, p))

    def clock() -> dict[str, float | int]:
        """The read's clock and counters, for a score target reached in it."""
        return {"wall_s": timer.measured_wall_now(), "run_wall_s": run_wall() if run_wall else timer.measured_wall_now(),
                "env_steps": progress.env_steps, "updates": progress.updates}

    def log_if_due(log_boundary: bool, phase: str | None = None) -> None:
        """The log phase's read of the mean loss and ``on_log``, at a log boundary or the run's end,
        timed as ``phase`` where given (else the caller's phase times it). A stop inside the step's
        updates leaves some owed: the row waits for them (paid first on resume), so that the
        resumed run logs what one uninterrupted run logs."""
        if not (log_boundary or finished(progress)) or progress.owed_updates >= 1.0:
            return
        with timer.phase(phase) if phase else contextlib.nullcontext():
            read_mean_loss(progress, loss_sum, log_boundary)
            # CUDA events mode: resolve the interval's event pairs here, where the loss read
            # has synchronised anyway, not when the pending list overflows mid-phase.
            timer.flush()
            on_log(progress)

    with gc_mode(t.gc):
        if progress.owed_updates >= 1.0:  # a resume of a run stopped inside a vector step's updates
            with timer.phase("train"):
                pay_updates(agent, buffer, progress, loss_sum, should_stop)
            # the interrupted step's log row, if it was a boundary (a log phase only then: the
            # phase's calls stay one per vector step)
            log_if_due(progress.vector_steps % t.log_every == 0, phase="log")
        while not finished(progress) and not should_stop():
            with timer.phase("select"):
                progress.epsilon = epsilon_at(cfg, progress.env_steps)
                actions = agent.act(obs, progress.epsilon)

            with timer.phase("step"):
                next_obs, rewards, terminated, _truncated, infos = env.step(actions)

            with timer.phase("push"):
                # final_obs is the true next observation of every board, also where the board
                # has already been reset; only termination stops the bootstrap.
                valid = infos.get("_valid")  # a NEXT_STEP env's reset steps are not transitions
                if valid is None:
                    buffer.push(obs, actions, rewards, infos["final_obs"], terminated)
                else:
                    buffer.push(obs[valid], actions[valid], rewards[valid], infos["final_obs"][valid], terminated[valid])
                obs = next_obs  # the hand-off people get wrong: after the push, not before

            progress.vector_steps += 1
            progress.env_steps += n
            with timer.phase("train"):
                if len(buffer) >= learning_starts:
                    progress.owed_updates += t.train_ratio
                    pay_updates(agent, buffer, progress, loss_sum, should_stop)

            with timer.phase("log"):
                episodes.record(infos)
                log_boundary = progress.vector_steps % t.log_every == 0
                # Flushed at every log boundary too, so a checkpoint taken there holds every episode.
                if episodes.full or (log_boundary and episodes.filled):
                    progress.add_episodes(*episodes.flush(progress.env_steps), clock=clock)
                log_if_due(log_boundary)
            timer.step_done()
            if on_step is not None:
                on_step()
            if progress.status == "diverged":
                break
    if episodes.filled:
        progress.add_episodes(*episodes.flush(progress.env_steps), clock=clock)
    return obs
