"""Async actor/learner mode: the shared replay under concurrent writers, and real runs end to end.

The stress tests use real processes writing through :class:`rlperf.shm.RingWriter` while this
process samples through :class:`rlperf.shm.ReplayReader`. Every transition is a deterministic
function of (writer, sequence number), so a torn slot (fields from two different writes), a slot
read before it was published, or a transition stored twice shows up as a checksum mismatch.
Module-level imports stay numpy-only so the writer processes start fast.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlperf.run.shm import (
    Layout,
    ReplayReader,
    RingWriter,
    Segment,
    UnsampledTracker,
    cleanup_stale,
    new_run_id,
    owner_pid,
    replay_fields,
    segment_name,
)

WIDTH = 24  # observation floats per transition: wide enough that a copy takes a while
CHUNK = 8  # most transitions per write


def encode(writer: int | np.ndarray, seq: np.ndarray) -> dict[str, np.ndarray]:
    """The transitions ``seq`` of ``writer``: every field derived from the pair."""
    writer = np.broadcast_to(np.asarray(writer, dtype=np.int64), seq.shape)
    obs = np.empty((len(seq), WIDTH), dtype=np.float32)
    obs[:, 0], obs[:, 1] = writer, seq
    obs[:, 2:] = (seq[:, None] * 3 + np.arange(WIDTH - 2) + writer[:, None] * 7) % 1009
    return {"obs": obs, "next_obs": obs + 0.5, "action": (seq * 31 + writer) % 3,
            "reward": ((seq * 13 + writer) % 101).astype(np.float32), "done": (seq % 7 == 0).astype(np.float32)}


def decode_and_check(out: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(writer, seq) of each row, after checking every field of every row against them."""
    writer, seq = out["obs"][:, 0].astype(np.int64), out["obs"][:, 1].astype(np.int64)
    for name, values in encode(writer, seq).items():
        rows = np.flatnonzero((out[name] != values).reshape(len(seq), -1).any(1))
        assert rows.size == 0, f"torn slot: {name} of writer {writer[rows[0]]} seq {seq[rows[0]]}"
    return writer, seq


def _writer_main(name: str, fields: dict, writer: int, ring: int, capacity: int, total: int, lock: Any) -> None:
    segment = Segment(name, Layout(fields), create=False)
    out = RingWriter(segment.arrays, ring, capacity, lock=lock)
    rng = np.random.default_rng(writer)
    seq = 0
    while seq < total:
        chunk = np.arange(seq, min(seq + int(rng.integers(1, CHUNK + 1)), total))
        f = encode(writer, chunk)
        out.write(f["obs"], f["action"], f["reward"], f["next_obs"], f["done"])
        seq += len(chunk)
    segment.close()


@pytest.mark.parametrize("mode", ["lockfree", "locked"])
def test_replay_stress_no_torn_or_duplicated_slots(mode: str) -> None:
    writers, capacity, total = 3, 64, 12_000  # tiny rings: writers lap the sampler all the time
    rings = writers if mode == "lockfree" else 1
    fields = replay_fields(rings, capacity, (WIDTH,))
    segment = Segment(segment_name(new_run_id(), "stress"), Layout(fields), create=True)
    ctx = mp.get_context("spawn")
    lock = ctx.Lock() if mode == "locked" else None
    procs = [ctx.Process(target=_writer_main, args=(segment.name, fields, w, w, capacity, total, lock), daemon=True)
             for w in range(writers)]
    try:
        for p in procs:
            p.start()
        reader = ReplayReader(segment.arrays, rings, capacity, CHUNK, batch=32, lock=lock, seed=1)
        checked = 0
        while any(p.is_alive() for p in procs) or checked == 0:
            slots = reader.sample()
            if slots is None:
                continue
            writer, seq = decode_and_check(reader.out)
            published = segment.arrays["widx"].copy()
            if mode == "lockfree":
                # Ring r holds writer r's transitions only, each in slot seq % capacity, all published.
                assert np.array_equal(slots // capacity, writer)
                assert np.array_equal(slots % capacity, seq % capacity)
                assert (seq < published[writer]).all()
            checked += len(seq)
        for p in procs:
            p.join(30)
            assert p.exitcode == 0
        # After the writers: each ring holds exactly the last `capacity` transitions written to it.
        a = segment.arrays
        everything = {k: a[k] for k in ("obs", "next_obs", "action", "reward", "done")}
        writer, seq = decode_and_check(everything)
        if mode == "lockfree":
            for r in range(rings):
                held = seq[r * capacity:(r + 1) * capacity]
                assert set(writer[r * capacity:(r + 1) * capacity]) == {r}
                assert sorted(held) == list(range(total - capacity, total))
        else:
            assert int(a["widx"][0]) == writers * total
            pairs = set(zip(writer.tolist(), seq.tolist(), strict=True))
            assert len(pairs) == capacity  # no transition stored twice
            order = (int(a["widx"][0]) + np.arange(capacity)) % capacity  # oldest slot first
            for w in range(writers):  # each writer's transitions appear in the order written
                mine = [s for s, ww in zip(seq[order], writer[order], strict=True) if ww == w]
                assert mine == sorted(mine)
        assert checked > 1000
        print(f"{mode}: {checked} sampled transitions checked, {reader.stats.redrawn} lapped slots redrawn")
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        segment.unlink()
        segment.close()


def test_unsampled_tracker_counts_overwritten_transitions_never_sampled() -> None:
    t = UnsampledTracker(rings=1, capacity=4)
    t.observe(np.array([4]))  # logical 0..3 in the ring
    t.mark(np.array([0, 1]))  # logical 0 and 1 sampled
    t.observe(np.array([7]))  # 0, 1, 2 overwritten; only 2 was never sampled
    assert (t.overwritten, t.unsampled) == (3, 1)
    t.observe(np.array([20]))  # 3..6 were visible and unsampled, 7..15 never seen at all
    assert (t.overwritten, t.unsampled) == (16, 14)
    t.mark(np.array([0]))  # logical 16 (slot 0)
    t.observe(np.array([21]))  # overwrites 16 -> sampled, not counted
    assert (t.overwritten, t.unsampled) == (17, 14)


def test_stale_segments_of_dead_owners_are_removed() -> None:
    ctx = mp.get_context("spawn")
    dead = ctx.Process(target=os.getpid)
    dead.start()
    dead.join()
    stale = f"rlperf_{dead.pid}_deadbeef_run"
    live = segment_name(new_run_id(), "live")  # our own pid: alive, must stay
    path = Path("/dev/shm")
    (path / stale).write_bytes(b"x")
    keep = Segment(live, Layout({"x": ((1,), "int64")}), create=True)
    try:
        assert owner_pid(stale) == dead.pid
        removed = cleanup_stale()
        assert stale in removed
        assert not (path / stale).exists()
        assert (path / live).exists()
    finally:
        keep.unlink()
        keep.close()
        (path / stale).unlink(missing_ok=True)


# -- real runs ------------------------------------------------------------------------------------


def _smoke(tmp_path: Path, *overrides: str) -> Any:
    from rlperf.config import config_from

    return config_from("smoke", ["run.mode=async", "async.actors=2", "async.envs_per_actor=16", *overrides])


def _assert_clean(record: dict) -> None:
    """No actor process left, no segment of this run left in /dev/shm."""
    import psutil

    for actor in record["async"]["per_actor"]:
        for pid in actor["pids"]:
            if psutil.pid_exists(pid):
                assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, f"actor pid {pid} still running"
    assert not Path("/dev/shm", record["async"]["replay"]["segment"]).exists()


def test_async_run_learns_and_keeps_the_record_layout(tmp_path: Path) -> None:
    """All fast forms: learning clearly beats a random policy (mean score ~0.14 on 6x6)."""
    from rlperf.run.lifecycle import train_run

    sync = train_run(_smoke(tmp_path, "run.mode=sync", "train.steps=100"), out=tmp_path, quiet=True).record
    # ε decays over env steps and the actor out-runs a CPU learner, so exploration must last. The
    # ops env kernel keeps the actor at a pace where the learner fits ~600-900 updates into the
    # 20,000 steps on 2 cores; with the fused kernel the actor collects ~4x faster and the learner
    # gets a third of that (async buys collection speed, not learning per env step).
    cfg = _smoke(tmp_path, "async.actors=1", "train.steps=20000", "agent.eps_decay_steps=10000", "env.kernel=ops")
    result = train_run(cfg, out=tmp_path, quiet=True)
    record = result.record
    assert result.exit_code == 0 and record["status"] == "completed"
    assert set(record) == set(sync) | {"async"}
    assert set(record["phases"]) >= {"select", "step", "push", "train", "log"}
    a = record["async"]
    assert record["totals"]["env_steps"] >= 20000 and record["totals"]["updates"] > 100
    assert a["experience_rate"] > 0 and a["learner_updates_per_s"] > 0
    assert 0 < a["learner_utilisation"] <= 1 and a["staleness_versions"]["max"] >= 0
    assert a["weight_syncs"] > 1 and a["publishes"] > 1 and a["lock_wait_s"] == {"learner": 0.0, "actors": 0.0}
    assert [p["exit_code"] for p in a["per_actor"]] == [0]
    # How many updates the learner fits in depends on the machine's load (0.7-2.5 seen), so the bar
    # is "clearly better than random" (3.5x the random policy's ~0.14), not a fixed learning curve.
    assert record["learning"]["mean_score_last_100"] > 0.5, record["learning"]
    _assert_clean(record)
    written = (result.run_dir / "run.json").read_text()
    assert '"async"' in written and (result.run_dir / "metrics.csv").read_text().count("\n") > 2


def test_async_run_with_every_seed_form(tmp_path: Path) -> None:
    """The seed's system: one locked ring, a polling learner, weight checks and state-dict publishing."""
    from rlperf.run.lifecycle import train_run

    cfg = _smoke(tmp_path, "train.steps=12000", "async.buffer=locked", "async.wait=sleep",
                 "async.weight_check=on", "async.publish=state_dict", "async.publish_every=2")
    record = train_run(cfg, out=tmp_path, quiet=True).record
    a = record["async"]
    assert record["status"] == "completed", record.get("error")
    assert record["totals"]["updates"] > 0, a
    assert a["replay"]["rings"] == 1 and a["lock_wait_s"]["learner"] > 0 and a["lock_wait_s"]["actors"] > 0, a
    # state_dict: every actor step syncs (a sync is skipped only while the learner is writing)
    assert a["weight_syncs"] + a["torn_weight_reads"] >= record["totals"]["vector_steps"]
    # The check compares after the copy; a publication landing in between makes "after" non-zero,
    # exactly as in the seed, so only its cost and its presence are checked here.
    assert a["weight_check_s"] > 0 and min(a["weight_check_diff"]["before"], a["weight_check_diff"]["after"]) >= 0, a
    _assert_clean(record)


def test_async_refuses_settings_it_cannot_honour(tmp_path: Path) -> None:
    from rlperf.errors import ConfigError
    from rlperf.run.lifecycle import train_run

    for override, words in (("env.backend=gym-sync", "env.backend"), ("buffer.storage=list", "buffer.storage"),
                            ("buffer.capacity=40", "buffer.capacity=40 is too small")):
        with pytest.raises(ConfigError, match=words):
            train_run(_smoke(tmp_path, override, "buffer.batch_size=8", "train.learning_starts=8"), out=tmp_path,
                      quiet=True)
    assert not list(tmp_path.iterdir())  # nothing written


def test_async_run_with_the_dashboard_on_prints_async_figures(tmp_path: Path, capsys) -> None:
    """The dashboard (not --quiet) draws the async metrics line; every async test above runs quiet."""
    from rlperf.run.lifecycle import train_run

    # The ops env kernel and the torch update keep the run long enough for the learner's first log row
    # (with the fused update the learner could finish 3,000 steps before it).
    cfg = _smoke(tmp_path, "async.actors=1", "train.steps=3000", "train.log_every=5", "env.kernel=ops",
                 "train.update=torch")
    result = train_run(cfg, out=tmp_path, quiet=False, dashboard=True)
    assert result.exit_code == 0 and result.record["status"] == "completed"
    err = capsys.readouterr().err
    assert "async: exp/s" in err and "env steps/s" in err
