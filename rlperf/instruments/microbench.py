"""Same-process micro-benchmarks of a knob's two forms: what the advisor's savings rest on.

After a profiled run, ``rlperf profile`` times the piece of work a slow knob form does (a replay
push, an env step, a sample, a target update, an action selection, a gradient update) in that form
and in its fast form, in the same process, at the run's sizes (boards, observation, network, batch)
and thread settings, and keeps the figures in the record (``profile.microbench``). A rule of
:mod:`rlperf.instruments.advisor` then scales the time the run measured for that piece by what the
fast form keeps of it: ``saving = measured × (1 − fast / slow)``. The run gives how much time is at
stake; the micro-benchmark, free of the profiler's own overhead, gives the fraction a fix removes.

The two forms are timed interleaved (slow, fast, slow, fast, ...), so drift on a shared machine
falls on both; each figure is the median over the repeats of the time per call, and each repeat
runs enough calls to last at least 10 ms (as ``torch.utils.benchmark``'s ``blocked_autorange``
does). Thread contention comes and goes with other processes' load, so the thread-count benchmark
runs longer: 25 repeats of 50 ms a form.

A benchmark is a :class:`Bench`: when it applies (the run's config has the slow form) and how to
build the two callables. Adding one for a new knob is one ``Bench`` in :data:`BENCHES`.
"""

from __future__ import annotations

import copy
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import torch

from rlperf.config import Config, apply_overrides
from rlperf import threads as thread_pools
from rlperf.instruments.advisor import run_threads

REPEATS = 7
BUDGET_S = 3.0
"""A benchmark's two forms together get about this long (fewer repeats, at least 3, when calls are slow)."""

Pair = tuple[Callable[[], Any] | None, Callable[[], Any]]


@dataclass(frozen=True)
class Bench:
    """One knob's slow and fast form, as two callables doing one unit of the work (``what``)."""

    name: str
    what: str  # "push of 256 transitions": the unit both callables do
    slow: str  # the slow form, "buffer.push=loop"
    fast: str  # the fast form, "buffer.push=batch"
    applies: Callable[[Config, Mapping[str, Any]], bool]
    # (config, device, record) -> the two callables; slow may be None: the run's own time is the slow figure
    build: Callable[[Config, torch.device, Mapping[str, Any]], Pair]
    repeats: int = REPEATS
    min_repeat_s: float = 0.01
    budget_s: float = BUDGET_S


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _per_call(fn: Callable[[], Any], calls: int, device: torch.device) -> float:
    _sync(device)
    t0 = perf_counter()
    for _ in range(calls):
        fn()
    _sync(device)
    return (perf_counter() - t0) / calls


def time_pair(slow: Callable[[], Any] | None, fast: Callable[[], Any], device: torch.device,
              repeats: int = REPEATS, budget_s: float = BUDGET_S, min_repeat_s: float = 0.01) -> dict[str, Any]:
    """Median seconds per call of ``slow`` and ``fast``, timed interleaved, each repeat at least
    ``min_repeat_s`` long; see the module docstring."""
    forms = {"fast": fast} if slow is None else {"slow": slow, "fast": fast}
    for fn in forms.values():  # warm-up: lazy initialisation is not the form's cost
        _per_call(fn, 1, device)
    once = {name: _per_call(fn, 1, device) for name, fn in forms.items()}
    calls = {name: max(1, round(min_repeat_s / max(s, 1e-9))) for name, s in once.items()}
    per_repeat = sum(max(s * calls[name], min_repeat_s) for name, s in once.items())
    repeats = max(3, min(repeats, int(budget_s / max(per_repeat, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(repeats):
        for name, fn in forms.items():
            samples[name].append(_per_call(fn, calls[name], device))
    out: dict[str, Any] = {"repeats": repeats}
    for name, xs in samples.items():
        out[f"{name}_s"] = statistics.median(xs)
        out[f"{name}_spread_s"] = (max(xs) - min(xs)) / 2
    return out


# -- what the benchmarks build -------------------------------------------------------------------


def _obs_shape(cfg: Config) -> tuple[int, ...]:
    from rlperf.env.backends import env_spec

    return env_spec(cfg)[0]


def _n_actions(cfg: Config) -> int:
    from rlperf.env.backends import env_spec

    return env_spec(cfg)[1]


def _transitions(cfg: Config, device: torch.device, n: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator(device=device).manual_seed(0)
    obs = torch.rand((n, *_obs_shape(cfg)), generator=g, device=device)
    actions = torch.randint(0, _n_actions(cfg), (n,), generator=g, device=device)
    return obs, actions, torch.zeros(n, device=device), obs.clone(), torch.zeros(n, dtype=torch.bool, device=device)


def _buffer(cfg: Config, device: torch.device, storage: str, push: str, fill: int = 0) -> Any:
    from rlperf.buffer import ReplayBuffer

    capacity = min(cfg.buffer.capacity, max(fill, 4 * cfg.env.num_envs, 4096))
    buffer = ReplayBuffer(capacity, _obs_shape(cfg), device, storage=storage, push=push, seed=0, check_memory=False)
    if fill:
        data = _transitions(cfg, device, min(fill, capacity))
        buffer.push(*data)
    return buffer


def _push(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    data = _transitions(cfg, device, cfg.env.num_envs)
    slow = _buffer(cfg, device, cfg.buffer.storage, "loop")
    fast = _buffer(cfg, device, cfg.buffer.storage, "batch")
    return (lambda: slow.push(*data)), (lambda: fast.push(*data))


def _storage_sample(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    fill = min(cfg.buffer.capacity, max(cfg.train.learning_starts, 4 * cfg.buffer.batch_size))
    slow = _buffer(cfg, device, cfg.buffer.storage, "batch", fill)
    fast = _buffer(cfg, device, "tensor", "batch", fill)
    b = cfg.buffer.batch_size
    return (lambda: slow.sample(b)), (lambda: fast.sample(b))


def _storage_push(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    data = _transitions(cfg, device, cfg.env.num_envs)
    slow = _buffer(cfg, device, cfg.buffer.storage, "batch")
    fast = _buffer(cfg, device, "tensor", "batch")
    return (lambda: slow.push(*data)), (lambda: fast.push(*data))


def _env(cfg: Config, device: torch.device, **changes: Any) -> Any:
    from rlperf.env.backends import build_env
    from rlperf.env.plan import plan_env

    variant = cfg.model_copy(update={"env": cfg.env.model_copy(update=changes)})
    env = build_env(variant, plan_env(variant, device))
    env.reset(seed=cfg.run.seed)
    return env


def _stepper(env: Any, n: int, device: torch.device, n_actions: int) -> Callable[[], Any]:
    """Step ``env`` with pre-drawn random actions (the RNG stays out of the timed call)."""
    g = torch.Generator(device=device).manual_seed(1)
    actions = [torch.randint(0, n_actions, (n,), generator=g, device=device) for _ in range(64)]
    state = {"i": 0}

    def step() -> Any:
        state["i"] = (state["i"] + 1) % len(actions)
        return env.step(actions[state["i"]])

    return step


def _flood_fill(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    n = cfg.env.num_envs
    slow, fast = _env(cfg, device, flood_fill="bfs"), _env(cfg, device, flood_fill="tensor")
    return _stepper(slow, n, device, _n_actions(cfg)), _stepper(fast, n, device, _n_actions(cfg))


def _backend(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    n = cfg.env.num_envs
    fast = _stepper(_env(cfg, device, backend="tensor"), n, device, _n_actions(cfg))
    if cfg.env.backend != "gym-sync":
        return None, fast  # gym-async's worker processes are not rebuilt here: the run's step time is the slow figure
    return _stepper(_env(cfg, device, backend="gym-sync"), n, device, _n_actions(cfg)), fast


def _kernel(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    n = cfg.env.num_envs
    slow, fast = _env(cfg, device, kernel="ops"), _env(cfg, device, kernel="fused")
    return _stepper(slow, n, device, _n_actions(cfg)), _stepper(fast, n, device, _n_actions(cfg))


def _ran_ops_kernel(cfg: Config, record: Mapping[str, Any]) -> bool:
    """The run stepped rlperf's Snake with the ops kernel on the CPU, where the fused one can run."""
    e = cfg.env
    return ((record.get("env") or {}).get("kernel") == "ops" and e.backend == "tensor" and e.flood_fill != "bfs"
            and not _cuda(record))


def _network(cfg: Config, device: torch.device) -> torch.nn.Module:
    from rlperf.dqn import QNetwork

    torch.manual_seed(cfg.run.seed)
    return QNetwork(_obs_shape(cfg), _n_actions(cfg), list(cfg.agent.hidden)).to(device)


def _target(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    q = _network(cfg, device)
    target = copy.deepcopy(q).requires_grad_(False)
    q_params: list[torch.Tensor] = list(q.parameters())
    target_params: list[torch.Tensor] = list(target.parameters())
    tau = cfg.agent.tau

    def soft() -> None:
        with torch.no_grad():
            torch._foreach_lerp_(target_params, q_params, tau)

    return (lambda: target.load_state_dict(q.state_dict())), soft


def _inference(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    q = _network(cfg, device)
    obs = _transitions(cfg, device, cfg.env.num_envs)[0]

    def graph() -> Any:
        return q(obs).argmax(1)

    def no_graph() -> Any:
        with torch.inference_mode():
            return q(obs).argmax(1)

    return graph, no_graph


def _updater(cfg: Config, device: torch.device, threads: int | None = None,
             switch: thread_pools.PoolSwitch | None = None) -> Callable[[], Any]:
    """One gradient update of the run's agent on a filled buffer (``threads``: every pool's count to run
    it with, set through ``switch``, which the forms of one benchmark share)."""
    from rlperf.dqn import Agent

    agent = Agent(cfg, _obs_shape(cfg), device, _n_actions(cfg))
    fill = min(cfg.buffer.capacity, max(4 * cfg.buffer.batch_size, cfg.env.num_envs))
    buffer = _buffer(cfg.model_copy(update={"buffer": cfg.buffer.model_copy(update={"capacity": fill})}), device,
                     "tensor", "batch", fill)
    if threads is None or switch is None:
        return lambda: agent.update(buffer)
    count, set_count = threads, switch

    def update() -> Any:
        set_count(count)
        return agent.update(buffer)

    return update


def _threads(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    """The run's update with every pool at the run's count, and at one."""
    switch = thread_pools.PoolSwitch()
    return _updater(cfg, device, run_threads(record), switch), _updater(cfg, device, 1, switch)


def _amp(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    bf16 = apply_overrides(cfg, ["train.amp=bf16"])
    return _updater(cfg, device), _updater(bf16, device)


def _batch(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    big = apply_overrides(cfg, [f"buffer.batch_size={4 * cfg.buffer.batch_size}",
                                f"buffer.capacity={max(cfg.buffer.capacity, 4 * cfg.buffer.batch_size)}"])
    return _updater(cfg, device), _updater(big, device)


def _update(cfg: Config, device: torch.device, record: Mapping[str, Any]) -> Pair:
    return (_updater(apply_overrides(cfg, ["train.update=torch"]), device),
            _updater(apply_overrides(cfg, ["train.update=fused"]), device))


def _ran_torch_update(cfg: Config, record: Mapping[str, Any]) -> bool:
    """The run's learner ran the torch update on the CPU, where the fused one can run."""
    from rlperf.fused_update import why_not_fused

    ran = (record.get("update") or {}).get("form", cfg.train.update)
    return ran == "torch" and not _cuda(record) and why_not_fused(cfg, torch.device("cpu")) is None


def _cuda(record: Mapping[str, Any]) -> bool:
    return str((record.get("system") or {}).get("device", "")).startswith("cuda")


BENCHES: tuple[Bench, ...] = (
    Bench("push", "push of {num_envs} transitions", "buffer.push=loop", "buffer.push=batch",
          lambda cfg, record: cfg.buffer.push == "loop", _push),
    Bench("storage_sample", "sample of {batch_size} transitions", "buffer.storage={storage}", "buffer.storage=tensor",
          lambda cfg, record: cfg.buffer.storage != "tensor", _storage_sample),
    Bench("storage_push", "batch push of {num_envs} transitions", "buffer.storage={storage}", "buffer.storage=tensor",
          lambda cfg, record: cfg.buffer.storage != "tensor" and cfg.buffer.push == "batch", _storage_push),
    Bench("flood_fill", "env step of {num_envs} boards", "env.flood_fill=bfs", "env.flood_fill=tensor",
          lambda cfg, record: cfg.env.flood_fill == "bfs", _flood_fill),
    Bench("backend", "env step of {num_envs} boards", "env.backend={backend}", "env.backend=tensor",
          lambda cfg, record: cfg.env.backend != "tensor", _backend),
    Bench("kernel", "env step of {num_envs} boards", "env.kernel=ops", "env.kernel=fused", _ran_ops_kernel, _kernel),
    Bench("update", "gradient update", "train.update=torch", "train.update=fused", _ran_torch_update, _update),
    Bench("target", "target update", "a hard state-dict copy", "a soft foreach lerp",
          lambda cfg, record: cfg.agent.target_update == "hard", _target),
    Bench("inference", "action selection for {num_envs} boards", "agent.inference=grad", "agent.inference=no_grad",
          lambda cfg, record: cfg.agent.inference == "grad", _inference),
    # Whenever the run had several threads: the advisor ranks the threads finding by it.
    Bench("threads", "gradient update", "{threads} threads per pool", "1 thread per pool",
          lambda cfg, record: run_threads(record) > 1, _threads, repeats=15, min_repeat_s=0.03, budget_s=3.0),
    Bench("amp", "gradient update", "train.amp=off", "train.amp=bf16",
          lambda cfg, record: _cuda(record) and cfg.train.amp == "off" and torch.cuda.is_bf16_supported(), _amp),
    Bench("batch", "gradient update", "buffer.batch_size={batch_size}", "4× the batch",
          lambda cfg, record: _cuda(record) and cfg.buffer.batch_size <= 256, _batch),
)


def run_benches(cfg: Config, device: torch.device, record: Mapping[str, Any],
                benches: tuple[Bench, ...] = BENCHES) -> dict[str, dict[str, Any]]:
    """Time every benchmark that applies to this run; ``{name: {what, slow, fast, slow_s, fast_s, ...}}``.

    Run with the run's thread settings (``run.threads``). A benchmark that fails is kept as its error:
    the rule that needs it then says its saving was not measured.
    """
    from rlperf.run.common import prepare, thread_settings_restored

    names = {"num_envs": f"{cfg.env.num_envs:,}", "batch_size": f"{cfg.buffer.batch_size:,}",
             "storage": cfg.buffer.storage, "backend": cfg.env.backend,
             "threads": str(run_threads(record))}
    out: dict[str, dict[str, Any]] = {}
    with thread_settings_restored():
        prepare(cfg)
        applied = thread_pools.current()
        threads = applied.policy.threads if applied is not None else None
        for bench in benches:
            if not bench.applies(cfg, record):
                continue
            entry: dict[str, Any] = {"what": bench.what.format(**names), "slow": bench.slow.format(**names),
                                     "fast": bench.fast.format(**names)}
            try:
                slow, fast = bench.build(cfg, device, record)
                entry.update(time_pair(slow, fast, device, bench.repeats, bench.budget_s, bench.min_repeat_s))
            except Exception as exc:  # a benchmark is evidence, not the run: report it and go on
                entry["error"] = f"{type(exc).__name__}: {exc}"
            finally:
                if threads is not None:  # a benchmark that switched counts leaves the run's behind
                    thread_pools.PoolSwitch()(threads)
            out[bench.name] = entry
    return out
