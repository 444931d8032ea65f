"""Benchmark the async actor/learner knobs: the seed 002/004 forms against the fixed forms.

For each actor count K it runs, on the same workload and at equal env steps:

- ``seed``: every slow form (``async.buffer=locked``, ``wait=sleep``, ``weight_check=on``,
  ``publish=state_dict``): the system the seeds review;
- the seed form with one knob switched to its fixed form (``+lockfree``, ``+event``,
  ``+no-weight-check``, ``+shared``);
- ``fixed``: every fixed form;
- ``sync``: the single-process vectorized loop with K x envs_per_actor boards and the same updates
  per transition (``train_ratio`` x K), for async vs sync at equal env steps.

Variants are interleaved repeat by repeat (so slow drift in machine load hits them all), each run
through :func:`rlperf.run.lifecycle.train_run` like ``rlperf train`` does. Printed: experience rate
(env transitions/s, warm-up and process start-up excluded), learner updates/s (since its first
update), lock wait (learner + actors), learner time waiting for data, actors' weight-sync time per
step, and ratios against ``seed``: medians over the repeats, with min-max when repeats > 1.

    python scripts/bench_async.py --actors 1,2 --repeats 3 --json async.json
    python scripts/bench_async.py --actors 1,2,4,8 --device cuda      # learner on a GPU box

The same comparison for one knob with ``rlperf compare`` (throughput rows only)::

    rlperf compare -c default --set run.mode=async --set async.actors=2 --set async.envs_per_actor=64 \\
        --steps 60000 --train-ratio 0.25 --vs async.publish=state_dict --repeats 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SEED_FORM = ["async.buffer=locked", "async.wait=sleep", "async.weight_check=on", "async.publish=state_dict"]
FIXED_FORM = ["async.buffer=lockfree", "async.wait=event", "async.weight_check=off", "async.publish=shared"]
ONE_FIX = {"+lockfree": "async.buffer=lockfree", "+event": "async.wait=event",
           "+no-weight-check": "async.weight_check=off", "+shared": "async.publish=shared"}


def variants(k: int, envs_per_actor: int, train_ratio: float) -> dict[str, list[str]]:
    base = [
        "run.mode=async",
        f"async.actors={k}",
        f"async.envs_per_actor={envs_per_actor}",
        f"train.train_ratio={train_ratio}",
    ]
    out = {"seed": base + SEED_FORM}
    for label, fix in ONE_FIX.items():
        out[label] = base + [o for o in SEED_FORM if o.split("=")[0] != fix.split("=")[0]] + [fix]
    out["fixed"] = base + FIXED_FORM
    # Sync with the same boards in one batch and the same updates per transition.
    out["sync"] = ["run.mode=sync", f"env.num_envs={k * envs_per_actor}", f"train.train_ratio={train_ratio * k}"]
    return out


def measure(record: dict[str, Any], wall: float) -> dict[str, float | None]:
    a = record.get("async")
    phases = record["phases"]
    out = {
        "env_steps_per_s": record["throughput"]["env_steps_per_s"],
        "updates": record["totals"]["updates"],
        "replay_ratio": record["throughput"]["replay_ratio"],
        "wall_s": wall,
        "run_s": record["totals"]["wall_s"] - record["totals"]["warmup_s"],
        "mean_score": record["learning"]["mean_score_last_100"],
    }
    if a is None:  # sync: updates/s over the measured loop, no locks, no waiting
        out.update(
            learner_updates_per_s=record["throughput"]["updates_per_s"],
            lock_wait_s=0.0,
            wait_share=0.0,
            sync_ms_per_step=0.0,
            staleness_updates=0.0,
        )
    else:
        out.update(
            learner_updates_per_s=a["learner_updates_per_s"],
            lock_wait_s=a["lock_wait_s"]["learner"] + a["lock_wait_s"]["actors"],
            wait_share=a["wait_for_data_share"],
            sync_ms_per_step=phases["sync"]["mean_ms"],
            staleness_updates=a["staleness_updates"]["mean"],
        )
    return out


# -- mechanisms, side by side ------------------------------------------------------------------------


def _timeit(fn: Any, n: int) -> float:
    """Median seconds per call over 5 rounds of ``n`` calls."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        rounds.append((time.perf_counter() - t0) / n)
    return statistics.median(rounds)


def micro_weights(cfg_name: str) -> list[tuple[str, str, float]]:
    """Actor weight sync per actor step, and the learner's publish, for each form."""
    import torch

    from rlperf.run.actors import CTRL_SEQ, Plan, PolicySync, layout_for, shared_qnetwork, shared_views
    from rlperf.run.learner import publish_weights
    from rlperf.config import config_from
    from rlperf.dqn import QNetwork
    from rlperf.run.shm import Segment, SeqLock, new_run_id, segment_name
    from rlperf.env.backends import env_spec

    torch.set_num_threads(1)
    rows = []
    for publish, check in (("state_dict", "on"), ("state_dict", "off"), ("shared", "on"), ("shared", "off")):
        cfg = config_from(cfg_name, ["run.mode=async", f"async.publish={publish}", f"async.weight_check={check}"])
        shape, n_actions = env_spec(cfg)
        q = QNetwork(shape, n_actions, list(cfg.agent.hidden))
        shapes = tuple(tuple(p.shape) for p in q.parameters())
        layout = layout_for(cfg, shape, sum(p.numel() for p in q.parameters()))[0]
        seg = Segment(segment_name(new_run_id(), "micro"), layout, create=True)
        try:
            plan = Plan(cfg, "ops", seg.name, layout, shape, n_actions, 1, shapes, 0)
            views = shared_views(plan, seg.arrays["weights"])
            model = shared_qnetwork(shape, n_actions, list(cfg.agent.hidden), views) if publish == "state_dict" else None
            seq = SeqLock(seg.arrays["ctrl"][CTRL_SEQ : CTRL_SEQ + 1])

            def publish_once(seq=seq, publish=publish, q=q, views=views, model=model) -> None:  # type: ignore[no-untyped-def]
                seq.begin()
                publish_weights(publish, q, views, model)
                seq.end()

            publish_once()
            local = QNetwork(shape, 3, list(cfg.agent.hidden))
            sync = PolicySync(plan, seg.arrays, local)
            label = f"publish={publish}, weight_check={check}"
            rows.append(("actor sync, no new weights", label, _timeit(sync.sync, 300)))

            def new_version_then_sync(seq=seq, sync=sync) -> None:  # type: ignore[no-untyped-def]
                seq.begin()
                seq.end()
                sync.sync()

            rows.append(("actor sync, new weights", label, _timeit(new_version_then_sync, 300)))
            if check == "off":
                rows.append(("learner publish", f"publish={publish}", _timeit(publish_once, 300)))
            del sync, model, views
        finally:
            seg.unlink()
            seg.close()
    return rows


def micro_sample(capacity: int, obs: int, batch: int) -> list[tuple[str, str, float]]:
    """One learner sample from a full replay: the seed's locked ring vs the per-actor rings (no writers)."""
    import multiprocessing as mp

    from rlperf.run.shm import Layout, ReplayReader, Segment, new_run_id, replay_fields, segment_name

    rows = []
    for mode, rings in (("locked", 1), ("lockfree", 2)):
        cap = capacity // rings
        seg = Segment(segment_name(new_run_id(), "micro"), Layout(replay_fields(rings, cap, (obs,))), create=True)
        try:
            seg.arrays["widx"][:] = cap * 3
            lock = mp.get_context("spawn").Lock() if mode == "locked" else None
            reader = ReplayReader(seg.arrays, rings, cap, 64, batch, lock=lock)
            rows.append(("learner sample (one batch)", f"buffer={mode}", _timeit(reader.sample, 300)))
            del reader
        finally:
            seg.unlink()
            seg.close()
    return rows


def _publisher(name: str, fields: dict, count: int, seed: int) -> None:
    """Publishes ``count`` times at random 0.5-3 ms intervals, stamping each with CLOCK_MONOTONIC."""
    import numpy as np

    from rlperf.run.actors import wake
    from rlperf.run.shm import Layout, Segment

    seg = Segment(name, Layout(fields), create=False)
    rng = np.random.default_rng(seed)
    stamp, index = seg.arrays["stamp"], seg.arrays["index"]
    for i in range(1, count + 1):
        time.sleep(float(rng.uniform(0.0005, 0.003)))
        stamp[0] = time.monotonic()
        index[0] = i
        if _WAKE is not None:
            wake(_WAKE)
    seg.close()


_WAKE: Any = None


def _publisher_with_wake(name: str, fields: dict, count: int, seed: int, signal_: Any) -> None:
    global _WAKE
    _WAKE = signal_
    _publisher(name, fields, count, seed)


def micro_wakeup(count: int = 1500) -> list[tuple[str, str, float]]:
    """How late the learner notices new data, and the CPU it burns waiting: sleep-poll vs event."""
    import multiprocessing as mp

    import numpy as np

    from rlperf.run.shm import Layout, Segment, new_run_id, segment_name

    ctx = mp.get_context("spawn")
    rows = []
    for mode in ("sleep", "event"):
        fields = {"stamp": ((1,), "float64"), "index": ((1,), "int64")}
        seg = Segment(segment_name(new_run_id(), "micro"), Layout(fields), create=True)
        signal_ = ctx.BoundedSemaphore(1) if mode == "event" else None  # what async.wait=event uses
        proc = ctx.Process(target=_publisher_with_wake, args=(seg.name, fields, count, 1, signal_), daemon=True)
        try:
            proc.start()
            seen, late = 0, []
            cpu0, t0 = time.process_time(), None
            while seen < count and (proc.is_alive() or int(seg.arrays["index"][0]) > seen):
                index = int(seg.arrays["index"][0])
                if index > seen:
                    if t0 is None:
                        t0, cpu0 = time.monotonic(), time.process_time()
                    late.append(time.monotonic() - float(seg.arrays["stamp"][0]))
                    seen = index
                    continue
                if signal_ is None:
                    time.sleep(0.001)
                else:
                    signal_.acquire(block=False)
                    if int(seg.arrays["index"][0]) == seen:
                        signal_.acquire(timeout=0.1)
            wall = time.monotonic() - (t0 or time.monotonic())
            cpu = time.process_time() - cpu0
            rows.append(("learner wake-up latency (median)", f"wait={mode}", float(np.median(late))))
            rows.append(("learner wake-up latency (p95)", f"wait={mode}", float(np.percentile(late, 95))))
            rows.append(("learner CPU while waiting (s per s)", f"wait={mode}", cpu / wall if wall else 0.0))
        finally:
            proc.join(10)
            seg.unlink()
            seg.close()
    return rows


def _contending_writer(name: str, fields: dict, ring: int, cap: int, chunk: int, lock: Any, seconds: float, out: Any) -> None:
    import numpy as np

    from rlperf.run.shm import Layout, RingWriter, Segment

    seg = Segment(name, Layout(fields), create=False)
    obs_w = fields["obs"][0][1]
    writer = RingWriter(seg.arrays, ring, cap, lock=lock)
    obs = np.random.default_rng(ring).random((chunk, obs_w), dtype=np.float32)
    action, reward, done = np.zeros(chunk, np.int64), np.zeros(chunk, np.float32), np.zeros(chunk, np.float32)
    waited, writes, end = 0.0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        waited += writer.write(obs, action, reward, obs, done)
        writes += 1
    out.put((writes * chunk, waited))
    seg.close()


def micro_contention(
    writers: int, seconds: float, capacity: int, obs: int, batch: int, chunk: int
) -> list[tuple[str, str, float]]:
    """Writers at full speed and the learner sampling at full speed: what the lock costs each side."""
    import multiprocessing as mp

    from rlperf.run.shm import Layout, ReplayReader, Segment, new_run_id, replay_fields, segment_name

    ctx = mp.get_context("spawn")
    rows = []
    for mode in ("locked", "lockfree"):
        rings = 1 if mode == "locked" else writers
        cap = capacity // rings
        fields = replay_fields(rings, cap, (obs,))
        seg = Segment(segment_name(new_run_id(), "micro"), Layout(fields), create=True)
        lock = ctx.Lock() if mode == "locked" else None
        out = ctx.Queue()
        procs = [
            ctx.Process(target=_contending_writer, args=(seg.name, fields, w, cap, chunk, lock, seconds, out), daemon=True)
            for w in range(writers)
        ]
        try:
            for p in procs:
                p.start()
            reader = ReplayReader(seg.arrays, rings, cap, chunk, batch, lock=lock)
            while reader.published() < capacity:  # wait for the writers and a full replay
                time.sleep(0.01)
            samples, t0 = 0, time.monotonic()
            while any(p.is_alive() for p in procs) and time.monotonic() - t0 < seconds * 0.8:
                if reader.sample() is not None:
                    samples += 1
            span = time.monotonic() - t0
            results = [out.get(timeout=60) for _ in procs]
            label = f"buffer={mode}, {writers} writer(s)"
            rows.append(("writes (transitions/s, all writers)", label, sum(r[0] for r in results) / seconds))
            rows.append(("writers' lock wait (share of their time)", label, sum(r[1] for r in results) / (seconds * writers)))
            rows.append(("learner samples/s", label, samples / span))
            rows.append(("learner lock wait (share of its time)", label, reader.stats.lock_wait_s / span))
            del reader
        finally:
            for p in procs:
                p.join(10)
            seg.unlink()
            seg.close()
    return rows


def run_micro(args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    from rlperf.config import config_from
    from rlperf.env.vector import observation_shape

    cfg = config_from(args.config, ["run.mode=async"])
    obs = int(__import__("numpy").prod(observation_shape(cfg.env.size, cfg.env.obs, cfg.env.flood_fill)))
    rows = micro_weights(args.config)
    rows += micro_sample(cfg.buffer.capacity, obs, cfg.buffer.batch_size)
    rows += micro_wakeup()
    for writers in (int(x) for x in args.actors.split(",")):
        rows += micro_contention(writers, 4.0, cfg.buffer.capacity, obs, cfg.buffer.batch_size, args.envs_per_actor)
    table = Table(
        title=f"async mechanisms, side by side in one process ({args.config}: hidden {list(cfg.agent.hidden)}, "
        f"batch {cfg.buffer.batch_size}, obs {obs} floats, {args.envs_per_actor} boards per write)"
    )
    for col in ("measure", "form", "value"):
        table.add_column(col, justify="right" if col == "value" else "left")
    for measure_, form, value in rows:
        unit = (
            ("µs", 1e6)
            if "latency" in measure_ or measure_.startswith(("actor", "learner publish", "learner sample "))
            else ("", 1)
        )
        text = (
            f"{value * unit[1]:,.1f} {unit[0]}"
            if unit[0]
            else (f"{value:.1%}" if "share" in measure_ or "per s" in measure_ else f"{value:,.0f}")
        )
        table.add_row(measure_, form, text)
    Console(width=200).print(table)
    return {"rows": [{"measure": m, "form": f, "value": v} for m, f, v in rows]}


def run_round(args: argparse.Namespace, r: int, plan: list[tuple[int, str, list[str]]], common: list[str],
              results: dict[str, dict[str, list[dict[str, Any]]]], console: Any) -> None:
    """One repeat of every planned run, in order; each run's figures go into ``results``."""
    from rlperf.config import config_from
    from rlperf.run.lifecycle import train_run

    for k, label, overrides in plan:
        cfg = config_from(args.config, common + overrides + [f"run.seed={r}"])
        t0 = time.perf_counter()
        record = train_run(cfg, out=args.out, name=f"K{k}-{label.strip('+')}", quiet=True, dashboard=False).record
        wall = time.perf_counter() - t0
        if record["status"] != "completed":
            console.print(f"[red]K={k} {label}: {record['status']}: {record.get('error')}")
            continue
        m = measure(record, wall)
        results.setdefault(str(k), {}).setdefault(label, []).append(m)
        console.print(
            f"repeat {r + 1}/{args.repeats} K={k} {label:16s} exp/s {m['env_steps_per_s']:9,.0f}  "
            f"learner upd/s {m['learner_updates_per_s']:7.1f}  lock {m['lock_wait_s']:.3f}s  "
            f"wall {wall:.1f}s",
            highlight=False,
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default="default")
    p.add_argument("--actors", default="1,2", help="comma-separated actor counts")
    p.add_argument("--envs-per-actor", type=int, default=64)
    p.add_argument("--steps", type=int, default=60_000, help="env transitions per run")
    p.add_argument("--train-ratio", type=float, default=0.25, help="updates per actor vector step")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="run.threads for every run (learner and sync loop)")
    p.add_argument("--device", default="cpu", help="the learner's device (actors are always on the CPU)")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="extra key=value for every run")
    p.add_argument("--only", default="", help="comma-separated variant labels to run (default: all)")
    p.add_argument("--out", default="/tmp/rlperf-bench-async")
    p.add_argument("--json", dest="json_path", default=None)
    p.add_argument("--micro", action="store_true", help="time each knob's mechanism side by side instead of whole runs")
    args = p.parse_args(argv)
    if args.micro:
        result = run_micro(args)
        if args.json_path:
            from rlperf.run.record import system_info

            Path(args.json_path).write_text(json.dumps({"args": vars(args), "system": system_info("cpu"), **result}, indent=2))
        return 0

    from rich.console import Console
    from rich.table import Table

    from rlperf.run.record import system_info

    console = Console(stderr=True)
    # One intra-op thread per process everywhere: async actors always use one, and a sync loop or a
    # learner whose OpenMP threads compete with other busy processes spins instead of working.
    common = [
        f"train.steps={args.steps}",
        "train.episodes=0",
        f"run.device={args.device}",
        "train.checkpoint=false",
        f"run.threads={args.threads}",
        *args.overrides,
    ]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    plan = []
    for k in (int(x) for x in args.actors.split(",")):
        for label, overrides in variants(k, args.envs_per_actor, args.train_ratio).items():
            if not args.only or label in args.only.split(","):
                plan.append((k, label, overrides))
    started = time.time()
    for r in range(args.repeats):
        run_round(args, r, plan, common, results, console)

    def med(runs: list[dict[str, Any]], key: str) -> tuple[float, float, float] | None:
        values = [x[key] for x in runs if x.get(key) is not None]
        return (statistics.median(values), min(values), max(values)) if values else None

    def cell(v: tuple[float, float, float] | None, fmt: str) -> str:
        if v is None:
            return "–"
        text = format(v[0], fmt)
        return text + (f" [{format(v[1], fmt)}–{format(v[2], fmt)}]" if args.repeats > 1 and v[1] != v[2] else "")

    summary: dict[str, Any] = {}
    for k, by_label in results.items():
        table = Table(
            title=f"async knobs, K = {k} actor(s) x {args.envs_per_actor} boards, {args.steps:,} env steps "
            f"({args.repeats} repeat(s), median [min–max])"
        )
        for col in (
            "variant",
            "exp/s",
            "× seed",
            "learner upd/s",
            "× seed",
            "lock wait s",
            "wait %",
            "sync ms/step",
            "updates",
            "run s",
        ):
            table.add_column(col, justify="left" if col == "variant" else "right")
        base = by_label.get("seed")
        base_exp = med(base, "env_steps_per_s")[0] if base else None
        base_upd = med(base, "learner_updates_per_s")[0] if base else None
        summary[k] = {}
        for label, runs in by_label.items():
            exp, upd = med(runs, "env_steps_per_s"), med(runs, "learner_updates_per_s")
            wait = med(runs, "wait_share")
            summary[k][label] = {key: med(runs, key) for key in runs[0]}
            table.add_row(
                label,
                cell(exp, ",.0f"),
                f"{exp[0] / base_exp:.2f}" if base_exp else "–",
                cell(upd, ".1f"),
                f"{upd[0] / base_upd:.2f}" if base_upd else "–",
                cell(med(runs, "lock_wait_s"), ".3f"),
                f"{wait[0] * 100:.0f}" if wait else "–",
                cell(med(runs, "sync_ms_per_step"), ".3f"),
                cell(med(runs, "updates"), ".0f"),
                cell(med(runs, "run_s"), ".1f"),
            )
        Console(width=200).print(table)
    console.print(f"total {time.time() - started:.0f} s")
    if args.json_path:
        machine = system_info(args.device)
        Path(args.json_path).write_text(
            json.dumps({"args": vars(args), "system": machine, "summary": summary, "runs": results}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
