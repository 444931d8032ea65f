"""Validated run configuration: pydantic models, TOML files and ``--set section.key=value`` overrides.

A config is built in one pass, so a stop condition given by a flag can replace the file's:
raw TOML table → ``--set`` overrides → flag values → one validation. Every user mistake (unknown
key, wrong type, out-of-range value, missing or malformed file) becomes a one-line `ConfigError`
that names the key and says what is allowed; the field descriptions below double as its hints.

Configs shipped with the package live in ``rlperf/configs/`` (``ci``, ``classic``, ``default``, ``fast``,
``naive``, ``smoke``); the repository's ``configs/`` holds byte-identical copies for ``--config configs/x.toml``.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from rlperf.errors import ConfigError, RlperfError
from rlperf.flags import RUN_FLAGS
from rlperf.inputfiles import CONFIG_MAX_BYTES, read_user_file

__all__ = [
    "AgentConfig",
    "AsyncConfig",
    "BufferConfig",
    "Config",
    "EnvConfig",
    "RunConfig",
    "TrainConfig",
    "apply_overrides",
    "config_from",
    "config_to_dict",
    "flat_keys",
    "load_config",
    "loads_config",
    "packaged_configs",
    "to_toml",
]

# Strict: a TOML string "256" is not silently an int, 1 is not silently a bool.
_MODEL = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, validate_assignment=True)


def _cross_field(message: str, hint: str) -> PydanticCustomError:
    """A cross-field error whose message already names the keys; the hint travels in ``ctx``."""
    return PydanticCustomError("cross_field", message, {"hint": hint})


SEED_MAX = 2**63 - 1
"""The largest ``run.seed``: seeds derived from it (repeat k's ``seed + k``, the actors' offsets) stay
inside the unsigned 64-bit range torch and NumPy accept."""
COUNT_MAX = 2**63 - 1
"""The largest ``train.steps`` / ``train.episodes``: counters past it do not fit the signed 64-bit
integers torch, NumPy and the record's readers hold them in (no run comes near it)."""
TRAIN_RATIO_MAX = 10_000
"""The most gradient updates per vector step. An update takes 20 µs to a few ms, so 10,000 make a
vector step of a fraction of a second to a minute: beyond that the envs all but stop stepping (the
seed's slow form, num_envs/4, is 64 at 256 boards)."""
THREADS_MAX = 1024
"""More threads than any machine runs (torch cannot take 2**64, OpenBLAS fails at about 100,000)."""


class RunConfig(BaseModel):
    """Where and how the run executes."""

    model_config = _MODEL

    seed: int = Field(0, ge=0, le=SEED_MAX, description="seed for the envs, the network and ε-greedy, 0 to 2**63-1")
    device: str = Field("auto", description="auto, cpu, cuda or cuda:N; auto picks cuda when available")
    threads: int = Field(0, ge=0, le=THREADS_MAX, description="threads for every pool the run loads (torch, numba, "
                         "BLAS/OpenMP), up to 1024; 0 = auto: 1 on the CPU, the libraries' defaults on CUDA "
                         "(docs/bottlenecks.md §14, rlperf explain 14)")
    mode: Literal["sync", "async"] = Field("sync", description="sync = one loop; async = actor processes and a learner")
    timing: Literal["auto", "sync", "events", "off"] = Field(
        "auto", description="phase timer mode on CUDA; auto = events on CUDA, perf_counter on CPU"
    )

    @field_validator("device")
    @classmethod
    def _device_form(cls, value: str) -> str:
        # Only the form is checked here; whether the device exists is rlperf.device's job.
        name = value.strip().lower()
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", name):
            raise PydanticCustomError("device_form", "input should be auto, cpu, cuda or cuda:N")
        return name


class EnvConfig(BaseModel):
    """The training env: the batched Snake (the default) or any registered Gymnasium env."""

    model_config = _MODEL

    id: str = Field(
        "rlperf/Snake-v0", min_length=1, description="a registered Gymnasium env id with Discrete actions and a Box "
        "observation, e.g. CartPole-v1; env.size, obs, flood_fill, hunger and initial_length are Snake's and apply to "
        "rlperf/Snake-v0 only"
    )
    num_envs: int = Field(256, ge=1, description="boards (envs) stepped together in one batch")
    size: int = Field(10, ge=4, le=64, description="board side in cells, 4 to 64")
    initial_length: int = Field(3, ge=1, description="snake length at reset, 1 to env.size")
    hunger: int = Field(0, ge=0, description="steps without a fruit before truncation; 0 = size*size")
    obs: Literal["features", "grid"] = Field(
        "features", description="features = danger/heading/fruit vector for an MLP; grid = board planes for a CNN"
    )
    flood_fill: Literal["off", "bfs", "tensor"] = Field(
        "off", description="reachable-space features: off; bfs = per-board Python BFS; tensor = batched on the device "
        "(docs/bottlenecks.md §4, rlperf explain 4)"
    )
    backend: Literal["tensor", "gym-sync", "gym-async"] = Field(
        "tensor", description="tensor = native batched env (Snake's, or a Gymnasium env's vector entry point); gym-sync, "
        "gym-async = gymnasium wrappers over single envs (docs/bottlenecks.md §5, rlperf explain 5)"
    )
    kernel: Literal["auto", "ops", "fused"] = Field(
        "auto", description="env step: ops = one tensor operator per rule; fused = one compiled per-board step "
        "(numba, CPU); auto = fused where it can run, else ops"
    )

    @model_validator(mode="after")
    def _length_fits(self) -> EnvConfig:
        if self.initial_length > self.size:
            raise _cross_field(
                f"env.initial_length ({self.initial_length}) is larger than env.size ({self.size})",
                "lower env.initial_length or raise env.size",
            )
        return self

    @model_validator(mode="after")
    def _kernel_applies(self) -> EnvConfig:
        if self.kernel != "fused":
            return self
        if self.backend != "tensor":
            raise _cross_field(
                f"env.kernel=fused steps the native batched env, but env.backend={self.backend} steps single boards",
                "use env.backend=tensor, or env.kernel=auto",
            )
        if self.flood_fill == "bfs":
            raise _cross_field(
                "env.kernel=fused computes the flood fill inside its kernel; env.flood_fill=bfs (the per-board "
                "Python reference) runs with env.kernel=ops",
                "use env.flood_fill=tensor with the fused kernel, or env.kernel=ops or auto",
            )
        return self


class AgentConfig(BaseModel):
    """The DQN agent: network, loss, target network, exploration."""

    model_config = _MODEL

    hidden: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=lambda: [256, 256], min_length=1, description="MLP hidden layer widths, e.g. [256, 256]"
    )
    gamma: float = Field(0.99, gt=0, le=1, description="discount factor, in (0, 1]")
    lr: float = Field(5e-4, gt=0, description="Adam learning rate, > 0")
    double: bool = Field(True, description="Double DQN targets")
    huber: bool = Field(True, description="Huber loss; false = MSE")
    grad_clip: float = Field(10.0, ge=0, description="max gradient norm; 0 = no clipping")
    target_update: Literal["hard", "soft"] = Field(
        "soft", description="hard = copy the weights every agent.target_every updates; soft = lerp by agent.tau "
        "(docs/bottlenecks.md §7, rlperf explain 7)"
    )
    tau: float = Field(0.005, gt=0, le=1, description="soft target update rate, in (0, 1]")
    target_every: int = Field(500, ge=1, description="gradient updates between hard target copies")
    inference: Literal["grad", "no_grad"] = Field(
        "no_grad", description="action selection: grad = autograd records a graph; no_grad = under torch.inference_mode "
        "(docs/bottlenecks.md §8, rlperf explain 8)"
    )
    eps_start: float = Field(1.0, ge=0, le=1, description="ε at the start, 0 to 1")
    eps_end: float = Field(0.05, ge=0, le=1, description="ε after the decay, 0 to 1")
    eps_decay_steps: int = Field(
        100_000, ge=1, description="env transitions over which ε decays linearly, unless agent.eps_decay_fraction applies"
    )
    eps_decay_fraction: float = Field(
        0.0, ge=0, le=1, description="ε decays over this fraction of the run's env steps, as Stable-Baselines3's "
        "exploration_fraction; applies when the run stops on train.steps (its length is known), else agent.eps_decay_steps "
        "does; 0 = off"
    )


class BufferConfig(BaseModel):
    """The replay buffer."""

    model_config = _MODEL

    capacity: int = Field(100_000, ge=1, description="transitions kept, at least buffer.batch_size")
    batch_size: int = Field(256, ge=1, description="transitions per gradient update")
    storage: Literal["list", "numpy", "tensor"] = Field(
        "tensor", description="list of tuples, host numpy arrays, or tensors on the model's device "
            "(docs/bottlenecks.md §2, rlperf explain 2)"
    )
    push: Literal["loop", "batch"] = Field(
        "batch", description="loop = per-board push with host copies; batch = one vectorized write "
            "(docs/bottlenecks.md §1, rlperf explain 1)"
    )

    @model_validator(mode="after")
    def _batch_fits(self) -> BufferConfig:
        if self.capacity < self.batch_size:
            raise _cross_field(
                f"buffer.capacity ({self.capacity}) is smaller than buffer.batch_size ({self.batch_size})",
                "raise buffer.capacity or lower buffer.batch_size",
            )
        return self


class TrainConfig(BaseModel):
    """The training loop: stop condition, update rate, logging and the speed knobs."""

    model_config = _MODEL

    episodes: int = Field(0, ge=0, le=COUNT_MAX, description="stop after this many finished episodes across boards "
                          "(summed over all env.num_envs boards, not per board), up to 2**63-1; 0 = no limit")
    steps: int = Field(0, ge=0, le=COUNT_MAX, description="stop after this many env transitions, up to 2**63-1; "
                       "0 = no limit")
    train_ratio: float = Field(
        1.0, ge=0, le=TRAIN_RATIO_MAX, description="gradient updates per vector step, 0 to 10,000 (an update takes "
            "20 µs to a few ms: more would make one vector step last minutes); 0.25 = one every 4 steps "
            "(docs/bottlenecks.md §3, rlperf explain 3)"
    )
    learning_starts: int = Field(5_000, ge=0, description="env transitions collected before updates start")
    log_every: int = Field(
        100, ge=1, description="vector steps between log phases; 1 = sync and log every step "
            "(docs/bottlenecks.md §9, rlperf explain 9)"
    )
    amp: Literal["off", "bf16", "fp16"] = Field("off", description="mixed precision for the update "
        "(docs/bottlenecks.md §10, rlperf explain 10)")
    compile: Literal["off", "default", "reduce-overhead", "max-autotune", "jit"] = Field(
        "off", description="torch.compile mode for the network, or jit for TorchScript "
            "(docs/bottlenecks.md §11, rlperf explain 11)"
    )
    grad_accum: int = Field(1, ge=1, description="micro-batches accumulated per optimizer step "
        "(docs/bottlenecks.md §12, rlperf explain 12)")
    update: Literal["auto", "torch", "fused", "graph"] = Field(
        "auto", description="the gradient update: torch = eager autograd, one dispatch per operator; fused = one "
        "compiled call per update (numba, CPU, MLP); graph = the torch update replayed as one CUDA graph (CUDA); "
        "auto = fused on the CPU, graph on CUDA, where they can run, else torch "
        "(docs/bottlenecks.md §20, rlperf explain 20)"
    )
    gc: Literal["on", "off", "freeze"] = Field(
        "on", description="Python garbage collector during the loop (docs/bottlenecks.md §13, rlperf explain 13)"
    )
    warmup_steps: int = Field(
        10, ge=0, description="vector steps from the first gradient update on, excluded from rates (so is the replay fill)"
    )
    score_targets: list[float] = Field(
        [5.0, 10.0, 20.0], max_length=16,
        description="mean scores (last 100 episodes) whose time to reach the record reports "
            "(docs/bottlenecks.md §19, rlperf explain 19)",
    )
    checkpoint: bool = Field(True, description="write checkpoint.pt at the end of the run")
    tensorboard: bool = Field(False, description="write TensorBoard scalars")

    @field_validator("score_targets")
    @classmethod
    def _targets(cls, value: list[float]) -> list[float]:
        if any(not math.isfinite(t) or t <= 0 for t in value):
            raise PydanticCustomError("score_targets", "input should be finite scores > 0, e.g. [5, 10, 20]")
        return sorted(set(value))


class AsyncConfig(BaseModel):
    """Actor/learner mode (``run.mode = "async"``)."""

    model_config = _MODEL

    actors: int = Field(2, ge=1, description="actor processes")
    envs_per_actor: int = Field(64, ge=1, description="boards each actor steps")
    buffer: Literal["locked", "lockfree"] = Field(
        "lockfree",
        description="locked = one lock over add and sample; lockfree = per-actor single-writer rings "
        "(docs/bottlenecks.md §15, rlperf explain 15)",
    )
    wait: Literal["sleep", "event"] = Field(
        "event",
        description="how the learner waits for data: sleep = poll; event = block on an event "
            "(docs/bottlenecks.md §16, rlperf explain 16)",
    )
    weight_check: Literal["on", "off"] = Field(
        "off", description="clone and compare the weights on every sync (docs/bottlenecks.md §17, rlperf explain 17)"
    )
    publish: Literal["state_dict", "shared"] = Field(
        "shared",
        description="weights to actors as a CPU state dict or through versioned shared tensors "
            "(docs/bottlenecks.md §18, rlperf explain 18)",
    )
    publish_every: int = Field(10, ge=1, description="learner updates between weight publications")
    restart_actors: bool = Field(False, description="restart an actor that dies instead of ending the run")
    stall_timeout_s: float = Field(
        10.0, gt=0,
        description="an actor that takes no step for this many seconds (alive but stuck: stopped, hung) is killed "
        "and handled like one that died",
    )


class Config(BaseModel):
    """A whole run. Every section is optional in TOML and defaults field by field.

    Build one with `load_config`, `apply_overrides` or `config_from`; these also check the stop
    condition, which a bare ``Config()`` (no episodes, no steps) does not have.
    """

    model_config = ConfigDict(extra="forbid", strict=True, validate_assignment=True, populate_by_name=True)

    run: RunConfig = Field(default_factory=RunConfig, description="where and how the run executes")
    env: EnvConfig = Field(default_factory=EnvConfig, description="the batched Snake boards")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="the DQN agent")
    buffer: BufferConfig = Field(default_factory=BufferConfig, description="the replay buffer")
    train: TrainConfig = Field(default_factory=TrainConfig, description="the training loop")
    async_: AsyncConfig = Field(default_factory=AsyncConfig, alias="async", description="actor/learner mode")

    @model_validator(mode="after")
    def _learning_can_start(self) -> Config:
        if self.train.learning_starts > self.buffer.capacity:
            raise _cross_field(
                f"train.learning_starts ({self.train.learning_starts}) is larger than buffer.capacity "
                f"({self.buffer.capacity}): the replay never holds that many transitions, so the run would never train",
                "lower train.learning_starts or raise buffer.capacity",
            )
        return self


# Section name as written in TOML and --set ("async") → its model class.
_SECTIONS: dict[str, type[BaseModel]] = {
    (info.alias or name): cast(type[BaseModel], info.annotation) for name, info in Config.model_fields.items()
}

# A key that, set with --set (and the other not), switches another off, as a flag stop condition
# replaces the config's (``config_from``): ε decay in absolute steps replaces a fraction of the run.
_REPLACES = {"agent.eps_decay_steps": ("agent.eps_decay_fraction", 0.0)}

# Flag name → the key it sets.
_FLAGS = {flag.name: flag.key for flag in RUN_FLAGS}


# ---------------------------------------------------------------------------------------------
# Public API


def packaged_configs() -> list[str]:
    """Names of the configs shipped inside the package (usable as ``load_config(name)``)."""
    folder = resources.files("rlperf") / "configs"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_config(path: str | Path | None = None) -> Config:
    """Load a config file: a path, a packaged config's bare name (``"naive"``), or None for ``default``.

    Keys a file leaves out take the model defaults (not ``default.toml``'s values), so a file that
    sets only ``train.steps`` does not inherit ``default.toml``'s episode limit.
    """
    data, source = _read(path)
    return _build(data, source)


def loads_config(text: str, source: str = "<string>") -> Config:
    """Parse a config from TOML text; ``source`` names it in error messages."""
    return _build(_parse(text, source), source)


def apply_overrides(cfg: Config, overrides: list[str]) -> Config:
    """Return a new config with each ``"section.key=value"`` applied, re-validated as a whole.

    A value is read as a TOML value when it parses (``1``, ``0.25``, ``true``, ``[128,128]``,
    ``"x"``), else as a bare string, so ``buffer.push=loop`` works without quotes.
    """
    data = config_to_dict(cfg)
    _set_overrides(data, overrides)
    return _build(data, "")


def config_from(path: str | Path | None = None, overrides: list[str] | None = None, **flags: Any) -> Config:
    """Load ``path``, apply ``--set`` overrides, then the flags that are not None, and validate once.

    Flags: ``envs``, ``episodes``, ``steps``, ``train_ratio``, ``device``, ``seed``. A flag stop
    condition replaces the config's: ``episodes=`` alone sets ``train.steps`` to 0, and vice versa.
    """
    unknown = sorted(set(flags) - set(_FLAGS))
    if unknown:
        raise TypeError(f"config_from() got unknown flags {unknown}; known: {sorted(_FLAGS)}")
    data, source = _read(path)
    _set_overrides(data, overrides or [])
    given = {name: value for name, value in flags.items() if value is not None}
    if "episodes" in given and "steps" not in given:
        given["steps"] = 0
    elif "steps" in given and "episodes" not in given:
        given["episodes"] = 0
    for name, value in given.items():
        section, key = _FLAGS[name].split(".")
        data.setdefault(section, {})[key] = value
    return _build(data, source if not (overrides or given) else f"{source} with overrides")


def check_override_value(cfg: Config, item: str) -> None:
    """Refuse ``"section.key=value"`` when the value cannot be that key's whatever the other keys are
    (wrong type, out of range, not a choice): a sweep refuses such a value before any trial runs.
    What depends on other keys (``buffer.capacity`` below ``buffer.batch_size``) is left to the
    whole config, grid point by grid point."""
    key, value = _split_override(item)
    section, name = key.split(".")
    data = {**config_to_dict(cfg)[section], name: value}
    try:
        _SECTIONS[section].model_validate(data)
    except ValidationError as exc:
        own = [{**e, "loc": (section, *e["loc"])} for e in exc.errors(include_url=False)
               if e["type"] != "cross_field" and tuple(e["loc"][:1]) == (name,)]
        if own:
            raise _to_config_error(own, "") from None


def config_to_dict(cfg: Config) -> dict[str, dict[str, Any]]:
    """The config as plain nested dicts, sections named as in TOML (``async``, not ``async_``)."""
    return cfg.model_dump(mode="python", by_alias=True)


def to_toml(cfg: Config) -> str:
    """The config as TOML text; ``loads_config(to_toml(cfg)) == cfg``."""
    return tomli_w.dumps(config_to_dict(cfg))


def flat_keys(cfg: Config) -> dict[str, Any]:
    """Every value under its ``"section.key"`` name, in declaration order."""
    return {f"{section}.{key}": value for section, table in config_to_dict(cfg).items() for key, value in table.items()}


# ---------------------------------------------------------------------------------------------
# Reading


def _read(path: str | Path | None) -> tuple[dict[str, Any], str]:
    """The raw TOML table of a path, a packaged name, or the packaged default; and its display name."""
    path_str = "default" if path is None else str(path)
    file = Path(path_str)
    if path is None or (not file.is_file() and _is_bare_name(path_str)):
        packaged = resources.files("rlperf") / "configs" / f"{path_str}.toml"
        if packaged.is_file():
            source = f"{path_str}.toml"
            return _parse(packaged.read_text(encoding="utf-8"), source), source
    if not file.exists():
        raise ConfigError(
            f"config file not found: {path_str}",
            hint=f"give a path to a .toml file or a packaged config: {', '.join(packaged_configs())}",
        )
    if not file.is_file():
        raise ConfigError(f"config path is not a file: {path_str}")
    try:
        text = read_user_file(file, "config", CONFIG_MAX_BYTES).decode("utf-8")
    except RlperfError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path_str}: {_one_line(str(exc))}") from None
    return _parse(text, path_str), path_str


def _is_bare_name(name: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9_-]+", name) is not None


def _parse(text: str, source: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message carries "(at line L, column C)".
        raise ConfigError(f"{source}: malformed TOML: {_one_line(str(exc))}") from None
    except RecursionError:  # tomllib recurses once per nested array or table
        raise ConfigError(f"{source}: values nested too deeply to be a config") from None


# ---------------------------------------------------------------------------------------------
# Overrides


def _set_overrides(data: dict[str, Any], overrides: list[str]) -> None:
    given: list[str] = []
    for item in overrides:
        key, value = _split_override(item)
        _set(data, key, value)
        given.append(key)
    for key in given:
        if key in _REPLACES and _REPLACES[key][0] not in given:
            _set(data, *_REPLACES[key])


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    section, name = key.split(".")
    table = data.setdefault(section, {})
    if not isinstance(table, dict):
        raise ConfigError(f"cannot set {key}: [{section}] in the config is not a table")
    table[name] = value


def _split_override(item: str) -> tuple[str, Any]:
    """``"section.key=value"`` → (checked key, parsed value)."""
    if "=" not in item:
        raise ConfigError(f"override {item!r} has no '='", hint="write --set section.key=value, e.g. --set buffer.push=loop")
    key, raw = (part.strip() for part in item.split("=", 1))
    parts = key.split(".")
    if len(parts) != 2 or not all(parts):
        raise ConfigError(
            f"override key {key!r} is not section.key",
            hint=f"sections: {', '.join(_SECTIONS)}; e.g. --set env.num_envs=64",
        )
    section, name = parts
    if section not in _SECTIONS:
        raise ConfigError(f"unknown config section {section!r} in --set {key}", hint=_suggest_section(section, name))
    if name not in _SECTIONS[section].model_fields:
        raise ConfigError(f"unknown config key {key!r}", hint=_suggest_key(section, name))
    return key, _parse_value(raw)


def _parse_value(raw: str) -> Any:
    """A TOML value if ``raw`` is one (``1``, ``0.25``, ``true``, ``[1, 2]``, ``"x"``), else ``raw``."""
    if "\n" not in raw and "\r" not in raw:
        try:
            return tomllib.loads(f"value = {raw}")["value"]
        except (tomllib.TOMLDecodeError, RecursionError):
            pass
    return raw


# ---------------------------------------------------------------------------------------------
# Validation and one-line errors


def _build(data: dict[str, Any], source: str) -> Config:
    try:
        cfg = Config.model_validate(data)
    except ValidationError as exc:
        raise _to_config_error(exc, source) from None
    if cfg.train.episodes == 0 and cfg.train.steps == 0:
        raise ConfigError(
            f"{_prefix(source)}no stop condition: train.episodes and train.steps are both 0",
            hint="set one, e.g. --episodes 5000 or --steps 100000",
        )
    return cfg


def _to_config_error(exc: ValidationError | list[Any], source: str) -> ConfigError:
    """Pydantic's multi-line report → one line naming each key, the value given and what is allowed."""
    errors = exc.errors(include_url=False) if isinstance(exc, ValidationError) else exc
    parts: list[str] = []
    hint: str | None = None
    for err in errors[:3]:
        text, err_hint = _describe_error(err)
        parts.append(text)
        hint = hint or err_hint
    if len(errors) > 3:
        parts.append(f"and {len(errors) - 3} more")
    return ConfigError(_one_line(_prefix(source) + "; ".join(parts)), hint=_one_line(hint) if hint else None)


def _describe_error(err: Any) -> tuple[str, str | None]:
    loc = [str(part) for part in err["loc"]]
    kind = err["type"]
    msg = err["msg"]
    msg = msg[0].lower() + msg[1:] if msg else msg
    if kind == "extra_forbidden":
        if len(loc) == 1:
            return f"unknown config section {loc[0]!r}", _suggest_section(loc[0])
        return f"unknown config key {'.'.join(loc[:2])!r}", _suggest_key(loc[0], loc[1])
    if kind == "cross_field":
        return err["msg"], err["ctx"]["hint"]
    key = ".".join(loc[:2])
    if len(loc) == 1:  # a whole section that is not a table
        return f"[{key}] should be a table of keys, got {_show(err['input'])}", f"sections: {', '.join(_SECTIONS)}"
    hint = None
    model = _SECTIONS.get(loc[0])
    if model is not None and loc[1] in model.model_fields:
        hint = f"{key}: {model.model_fields[loc[1]].description}"
    where = ".".join(loc)
    return f"{where} = {_show(err['input'])} is invalid: {msg}", hint


def _prefix(source: str) -> str:
    return f"{source}: " if source else ""


def _show(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _suggest_section(section: str, name: str | None = None) -> str:
    close = difflib.get_close_matches(section, list(_SECTIONS), n=1, cutoff=0.6)
    if close:
        if name is not None and name in _SECTIONS[close[0]].model_fields:
            return f"did you mean '{close[0]}.{name}'?"
        return f"did you mean {close[0]!r}? sections: {', '.join(_SECTIONS)}"
    # A key written without its section ("seed" instead of "run.seed").
    owners = [f"{s}.{section}" for s, model in _SECTIONS.items() if section in model.model_fields]
    if owners:
        return f"did you mean {owners[0]!r}? keys go under a section"
    return f"sections: {', '.join(_SECTIONS)}"


def _suggest_key(section: str, name: str) -> str:
    fields = list(_SECTIONS[section].model_fields) if section in _SECTIONS else []
    close = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
    if close:
        return f"did you mean '{section}.{close[0]}'?"
    owners = [f"{s}.{name}" for s, model in _SECTIONS.items() if name in model.model_fields]
    if owners:
        return f"did you mean {owners[0]!r}? {name} is in [{owners[0].split('.')[0]}]"
    return f"keys in [{section}]: {', '.join(fields)}"
