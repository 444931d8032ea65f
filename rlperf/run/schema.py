"""The run record's schema, checked once, when a record is read: kinds, types, ranges, finite numbers.

Every command that reads records (``compare``, its CI gate, ``sweep`` and its objectives,
``--resume``) loads them with :func:`read_record`, so what they compute from a record can trust it:
a count is a whole number ≥ 0, a time a finite number ≥ 0, a share a fraction, a section an
object. A record that breaks a rule -- hand-edited, cut short, written by a buggy script through
``rlperf.PhaseTimer`` -- is refused with one line naming the field, never a traceback or a figure
computed from nonsense (``env steps/s -27.9 k/s``). Only regular files, at most
:data:`~rlperf.inputfiles.RECORD_MAX_BYTES`, are read (:func:`rlperf.inputfiles.read_user_file`).

The rules cover the fields readers use; a field this rlperf does not know is kept as it is, except
that every number anywhere in a record must be finite (JSON has no NaN; Python's parser accepts it)
and nothing may nest deeper than :data:`DEPTH_MAX` levels (readers that recurse stay safe).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rlperf.errors import RlperfError
from rlperf.inputfiles import RECORD_MAX_BYTES, read_user_file

SCHEMA = 1
"""Version of the record and checkpoint layouts; bump it when a reader would misread an older one."""

RECORD_NAME = "run.json"
CHECKPOINT_NAME = "checkpoint.pt"

RUN_KINDS = frozenset({"train", "profile", "sweep", "compare", "replay", "external"})
"""What ``kind`` a run record can have (the command that made the run; ``external``: ``rlperf.PhaseTimer``)."""
STATUSES = frozenset({"completed", "interrupted", "diverged", "failed"})

COUNT_MAX = 2**63 - 1
"""The largest count a record can hold (what an int64 counter reaches)."""

DEPTH_MAX = 64
"""The deepest nesting a record may have (rlperf's own are 5 deep; a PhaseTimer's config is the user's)."""

SECTIONS = ("config", "system", "threads", "env", "timing", "totals", "throughput", "phases", "learning", "memory",
            "time_to_score", "checkpoint", "files")
"""Top-level fields that are objects (or null) when present."""

_HINT = "records are written by rlperf train/profile/compare or rlperf.PhaseTimer.save; pass one as it was written"


# -- value rules: each returns what the value should be, or None when it is fine -------------------


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def count(v: Any) -> str | None:
    return None if _is_int(v) and 0 <= v <= COUNT_MAX else "a whole number from 0 to 2**63-1"


def positive_count(v: Any) -> str | None:
    return None if _is_int(v) and 1 <= v <= COUNT_MAX else "a whole number from 1 to 2**63-1"


def non_negative(v: Any) -> str | None:
    return None if _is_real(v) and math.isfinite(v) and v >= 0 else "a finite number ≥ 0"


def number(v: Any) -> str | None:
    return None if _is_real(v) and math.isfinite(v) else "a finite number"


def fraction(v: Any) -> str | None:
    # Shares are sums of float times divided by their total: allow the last bit of rounding over 1.
    return None if _is_real(v) and 0 <= v <= 1 + 1e-9 else "a fraction from 0 to 1"


def text(v: Any) -> str | None:
    return None if isinstance(v, str) else "a string"


def flag(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def obj(v: Any) -> str | None:
    return None if isinstance(v, dict) else "an object"


def array(v: Any) -> str | None:
    return None if isinstance(v, list) else "a list"


def optional(rule: Callable[[Any], str | None]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        if v is None:
            return None
        what = rule(v)
        return None if what is None else f"{what} or null"

    return check


def one_of(values: frozenset[str]) -> Callable[[Any], str | None]:
    def check(v: Any) -> str | None:
        return None if isinstance(v, str) and v in values else f"one of {', '.join(sorted(values))}"

    return check


_MS = ("mean_ms", "p25_ms", "p50_ms", "p95_ms", "min_ms", "max_ms")

# Fields by path; "*" matches every key of an object, "[]" every item of a list.
RULES: tuple[tuple[str, Callable[[Any], str | None]], ...] = (
    ("name", optional(text)),
    ("run_dir", optional(text)),
    ("started_at", optional(text)),
    ("command", optional(array)),
    ("resumed", optional(array)),
    ("error", optional(text)),
    *((section, optional(obj)) for section in SECTIONS),
    ("config.*", optional(obj)),
    ("config.env.id", optional(text)),
    ("config.env.num_envs", optional(positive_count)),
    ("config.env.size", optional(positive_count)),
    ("system.*", lambda v: None if v is None or isinstance(v, (str, bool)) or number(v) is None
     else "a string, a number or null"),
    ("threads.count", optional(positive_count)),
    ("threads.why", optional(text)),
    ("threads.pools", optional(array)),
    ("threads.pools.[]", obj),
    ("threads.pools.[].threads", optional(count)),
    ("threads.contention", optional(obj)),
    *((f"threads.contention.{k}", optional(non_negative)) for k in (
        "wall_s", "run_queue_wait_s", "involuntary_switches", "involuntary_switches_process", "loadavg_1m_start",
        "loadavg_1m_end", "cpus")),
    ("threads.contention.wait_share", optional(fraction)),
    ("env.kernel", optional(text)),
    ("timing.mode", optional(text)),
    ("timing.timer_id", optional(text)),
    *((f"timing.{k}", optional(count)) for k in ("warmup_steps", "fill_steps", "measured_steps", "measured_env_steps",
                                                   "measured_episodes", "measured_updates", "asked_window_steps")),
    *((f"timing.{k}", optional(non_negative)) for k in ("warmup_s", "measured_wall_s")),
    ("timing.vector_step", optional(obj)),
    ("timing.vector_step.calls", optional(count)),
    *((f"timing.vector_step.{k}", optional(non_negative)) for k in (*_MS, "mean_less_wait_ms")),
    ("timing.vector_step.cpu_wait_share", optional(fraction)),
    *((f"totals.{k}", optional(count)) for k in ("episodes", "env_steps", "vector_steps", "updates")),
    ("totals.num_envs", optional(positive_count)),
    *((f"totals.{k}", optional(non_negative)) for k in ("wall_s", "warmup_s")),
    ("throughput.*", optional(non_negative)),
    ("phases.*", obj),
    ("phases.*.total_s", optional(non_negative)),
    ("phases.*.self_s", optional(non_negative)),
    ("phases.*.share", optional(fraction)),
    ("phases.*.calls", optional(count)),
    *((f"phases.*.{k}", optional(non_negative)) for k in _MS),
    ("intervals", optional(array)),
    ("intervals.[]", obj),
    ("learning.*", lambda v: None if v is None or number(v) is None else "a finite number or null"),
    ("memory.rss_scope", optional(text)),
    *((f"memory.{k}", optional(non_negative)) for k in ("peak_rss_mb", "peak_cuda_mb", "replay_mb")),
    ("time_to_score.targets", optional(array)),
    ("time_to_score.targets.[]", obj),
    ("time_to_score.targets.[].score", number),
    ("time_to_score.targets.[].reached", optional(flag)),
    *((f"time_to_score.targets.[].{k}", optional(non_negative)) for k in ("wall_s", "run_wall_s", "env_steps", "updates",
                                                                                 "episodes")),
)


def _values(node: Any, parts: list[str], at: str) -> list[tuple[str, Any]]:
    """The (path, value) pairs a rule's path names in ``node`` (absent keys: none)."""
    if not parts:
        return [(at, node)]
    head, rest = parts[0], parts[1:]
    if head == "[]":
        items = node if isinstance(node, list) else []
        return [p for i, item in enumerate(items) for p in _values(item, rest, f"{at}[{i}]")]
    if not isinstance(node, dict):
        return []
    keys = list(node) if head == "*" else [head] if head in node else []
    return [p for k in keys for p in _values(node[k], rest, f"{at}.{k}" if at else str(k))]


def _bad_value(record: Any) -> str | None:
    """What is wrong with the first NaN or infinity anywhere in ``record``, or with a value nested
    deeper than :data:`DEPTH_MAX` (walked iteratively: depth is no risk here, but is to recursive readers)."""
    stack: list[tuple[str, Any, int]] = [("", record, 0)]
    while stack:
        at, node, depth = stack.pop()
        if depth > DEPTH_MAX:
            return f"{at[:60]}... is nested deeper than {DEPTH_MAX} levels"
        if isinstance(node, float) and not math.isfinite(node):
            return f"{at or 'the record'} is not a finite number"
        if isinstance(node, dict):
            stack.extend((f"{at}.{k}" if at else str(k), v, depth + 1) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((f"{at}[{i}]", v, depth + 1) for i, v in enumerate(node))
    return None


def short(value: Any) -> str:
    """A value as JSON, at most 40 characters (control characters escaped by JSON itself)."""
    shown = json.dumps(value, default=str)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def validate_record(record: Any, file: str | Path) -> dict[str, Any]:
    """``record`` if it is a run record this rlperf can read; one-line RlperfError naming the first
    field that breaks a rule otherwise (see the module docstring)."""
    if not isinstance(record, dict):
        raise RlperfError(f"run record {file} is not a JSON object")
    schema = record.get("schema")
    if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
        raise RlperfError(f"run record {file} has no valid schema version (got {short(schema)})")
    if schema > SCHEMA:
        raise RlperfError(f"record {file} has schema {schema}, this rlperf reads ≤ {SCHEMA}", hint="upgrade rlperf")
    kind = record.get("kind")
    if kind == "sweep" and "trials" in record:
        raise RlperfError(f"{file} is a sweep's summary (sweep.json), not a run record",
                          hint=f"pass the trials' run directories, e.g. {Path(file).parent}/trial000-*")
    if "rows" in record and "runs" in record:
        raise RlperfError(f"{file} is a comparison (rlperf compare --json), not a run record",
                          hint="pass the run directories it compared")
    if kind is not None and (not isinstance(kind, str) or kind not in RUN_KINDS):
        raise RlperfError(f"{file} is not a run record (kind {short(kind)})",
                          hint=f"run records have kind {', '.join(sorted(RUN_KINDS))}")
    status = record.get("status")
    if not isinstance(status, str) or status not in STATUSES:
        what = "no status" if status is None else f"status {short(status)}"
        raise RlperfError(f"{file} is not a run record ({what})",
                          hint="pass a run directory written by rlperf, or its run.json")
    for path, rule in RULES:
        if path == "config.*" and kind == "external":  # a PhaseTimer's config is the script's: vars(args) is flat
            continue
        for at, value in _values(record, path.split("."), ""):
            expected = rule(value)
            if expected is not None:
                raise RlperfError(f"run record {file} is damaged: {at} is {short(value)}, expected {expected}", hint=_HINT)
    bad = _bad_value(record)
    if bad is not None:
        raise RlperfError(f"run record {file} is damaged: {bad}", hint=_HINT)
    _check_consistent(record, file)
    return record


def _check_consistent(record: Mapping[str, Any], file: str | Path) -> None:
    """Rules between fields: the figures derived from ``num_envs`` must agree with it."""
    totals = record.get("totals") or {}
    envs, vector, env_steps = totals.get("num_envs"), totals.get("vector_steps"), totals.get("env_steps")
    if envs is not None and vector is not None and env_steps is not None and env_steps != vector * envs:
        raise RlperfError(f"run record {file} is damaged: totals.env_steps {env_steps} is not totals.vector_steps "
                          f"{vector} × totals.num_envs {envs}", hint=_HINT)


def read_record(path: str | Path) -> dict[str, Any]:
    """Load and validate a run record from a run directory or a ``run.json`` (see the module docstring)."""
    path = Path(path)
    file = path / RECORD_NAME if path.is_dir() else path
    try:
        data = read_user_file(file, "run record", RECORD_MAX_BYTES)
    except FileNotFoundError:
        if path.is_dir():
            hint = ("a run killed before its record was written gets it from rlperf train --resume "
                    f"{path}" if (path / CHECKPOINT_NAME).is_file() else "pass a run directory or its run.json")
            raise RlperfError(f"{path} has no {RECORD_NAME}", hint=hint) from None
        raise RlperfError(f"no run record at {path}", hint="pass a run directory or its run.json") from None
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise RlperfError(f"run record {file} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise RlperfError(f"run record {file} is not valid JSON (line {e.lineno}: {e.msg})") from None
    except RecursionError:
        raise RlperfError(f"run record {file} is nested too deeply to be a run record") from None
    return validate_record(record, file)


def check_comparable_record(record: Mapping[str, Any], file: str | Path) -> None:
    """What ``compare`` needs on top of :func:`read_record`: the command that made it and the
    measured sections (a hand-written ``{"schema": 1, "status": ...}`` is not evidence)."""
    kind = record.get("kind")
    if not isinstance(kind, str) or kind not in RUN_KINDS:
        raise RlperfError(f"{file} is not a run record (no kind)", hint="pass a run directory written by rlperf")
    missing = [s for s in ("system", "throughput", "phases") if not isinstance(record.get(s), dict)]
    if missing:
        raise RlperfError(f"run record {file} has no {', '.join(missing)}", hint="pass a run directory written by rlperf")
