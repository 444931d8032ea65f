"""Shared-memory building blocks of the actor/learner mode: one segment per run, replay rings, a seqlock.

Everything lives in numpy views over one ``multiprocessing.shared_memory`` segment per run, named
``rlperf_<pid>_<token>_<part>`` after the learner that created it, so a segment left behind by a
killed run is recognised (its pid is dead) and removed by :func:`cleanup_stale` at the next start.
The module itself needs only numpy: the arrays are plain views, and the processes that use them
bring their own torch (the actors act with a policy, the learner trains).

The replay comes in the two forms of the ``async.buffer`` knob (docs/bottlenecks.md §15):

- ``locked`` — the common shared buffer: one ring for all actors and one lock held across the whole
  add (slot writes and index update) and the whole sample (index draw, gathers).
- ``lockfree`` — one single-writer ring per actor. The actor writes the slots first and then
  publishes its write index (one aligned 8-byte store); the learner reads only slots below a
  published index, and after copying a sample it re-reads the indices and redraws any slot a writer
  may have lapped meanwhile. On x86-64 stores become visible in program order and loads are not
  reordered with loads (TSO), which is what makes "data, then index" and the re-check sound; the
  stress test in tests/test_async.py checks it with checksums.

A write index counts every transition the ring ever received ("logical index"); slot = logical %
capacity, so the ring holds logical indices ``[max(0, W - capacity), W)``.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import numpy as np

from rlperf.run.files import pid_alive

PREFIX = "rlperf_"
SHM_DIR = "/dev/shm"
_ALIGN = 64  # each array starts on its own cache line
LOCK_POLL_S = 0.05  # every lock wait wakes up this often to check liveness and stop flags


class ReplayLockTimeout(RuntimeError):
    """The replay lock could not be taken for too long (a holder died inside it)."""


# -- names and stale segments --------------------------------------------------------------------


def new_run_id() -> str:
    """``<pid>_<token>``: unique per run and tells :func:`cleanup_stale` who owns the segments."""
    return f"{os.getpid()}_{secrets.token_hex(4)}"


def segment_name(run_id: str, part: str) -> str:
    return f"{PREFIX}{run_id}_{part}"


def owner_pid(name: str) -> int | None:
    """The pid encoded in a segment name ``rlperf_<pid>_...``, or None if it is not one of ours."""
    if not name.startswith(PREFIX):
        return None
    head = name[len(PREFIX):].split("_", 1)[0]
    return int(head) if head.isdigit() else None


def cleanup_stale(shm_dir: str = SHM_DIR) -> list[str]:
    """Unlink ``rlperf_*`` segments whose owning process is gone; returns the names removed."""
    try:
        names = os.listdir(shm_dir)
    except OSError:
        return []
    removed = []
    for name in names:
        pid = owner_pid(name)
        if pid is None or pid_alive(pid):
            continue
        try:
            os.unlink(os.path.join(shm_dir, name))
            removed.append(name)
        except FileNotFoundError:
            pass
    return removed


def shm_free_bytes(shm_dir: str = SHM_DIR) -> int | None:
    """Free bytes on the shared-memory filesystem (None where it cannot be asked)."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


# -- one segment, many arrays -------------------------------------------------------------------


class Layout:
    """Named arrays packed into one buffer, each aligned to a cache line."""

    def __init__(self, fields: dict[str, tuple[tuple[int, ...], str]]) -> None:
        self.fields = dict(fields)
        self.offsets: dict[str, int] = {}
        offset = 0
        for name, (shape, dtype) in self.fields.items():
            offset = -(-offset // _ALIGN) * _ALIGN
            self.offsets[name] = offset
            offset += int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        self.nbytes = max(offset, 1)

    def views(self, buf: Any) -> dict[str, np.ndarray]:
        return {
            name: np.ndarray(shape, dtype=dtype, buffer=buf, offset=self.offsets[name])
            for name, (shape, dtype) in self.fields.items()
        }


class _SharedMemory(shared_memory.SharedMemory):
    """``SharedMemory`` whose ``close`` tolerates views that are still alive.

    numpy/torch views keep the mapping exported, and the stock ``close`` (also run from ``__del__``)
    then raises ``BufferError``. The mapping is released with the last view or at process exit;
    what must not outlive the run is the name, and ``unlink`` removes that regardless.
    """

    def close(self) -> None:
        try:
            super().close()
        except BufferError:
            fd: int = getattr(self, "_fd", -1)
            if fd >= 0:
                os.close(fd)
                self._fd = -1


class Segment:
    """A run's shared-memory segment: create it in the learner, attach to it in the actors."""

    def __init__(self, name: str, layout: Layout, create: bool) -> None:
        self.name = name
        self.layout = layout
        self._shm = _SharedMemory(name=name, create=create, size=layout.nbytes if create else 0)
        self.arrays = layout.views(self._shm.buf)
        if create:
            for array in self.arrays.values():
                array.fill(0)

    def close(self) -> None:
        self.arrays = {}
        self._shm.close()

    def unlink(self) -> None:
        """Remove the name (idempotent); processes that still map it keep their mapping."""
        try:
            self._shm.unlink()
        except FileNotFoundError:
            pass


# -- replay --------------------------------------------------------------------------------------


def replay_fields(rings: int, capacity: int, obs_shape: tuple[int, ...]) -> dict[str, tuple[tuple[int, ...], str]]:
    """The replay's arrays: ``rings`` rings of ``capacity`` slots each, stored back to back."""
    n = rings * capacity
    return {
        "widx": ((rings,), "int64"),
        "obs": ((n, *obs_shape), "float32"),
        "next_obs": ((n, *obs_shape), "float32"),
        "action": ((n,), "int64"),
        "reward": ((n,), "float32"),
        "done": ((n,), "float32"),
    }


FIELDS = ("obs", "action", "reward", "next_obs", "done")


def acquire(lock: Any, give_up: Callable[[], bool], poll_s: float = LOCK_POLL_S) -> bool:
    """Take ``lock``, waking every ``poll_s`` to ask ``give_up()``; False if it gave up."""
    while not lock.acquire(timeout=poll_s):
        if give_up():
            return False
    return True


class RingWriter:
    """An actor's side of the replay: ``write`` one batch of transitions.

    ``lockfree``: the actor owns ring ``ring`` and is its only writer. ``locked``: every actor
    writes ring 0 under ``lock``; ``holding[0]`` is 1 while this writer holds it, so the learner
    can tell that a dead actor died inside the lock.
    """

    def __init__(self, arrays: dict[str, np.ndarray], ring: int, capacity: int, lock: Any = None,
                 holding: np.ndarray | None = None, give_up: Callable[[], bool] = lambda: False) -> None:
        self._a = arrays
        self._widx = arrays["widx"]
        self.ring = 0 if lock is not None else ring
        self.capacity = capacity
        self._lock = lock
        self._holding = holding
        self._give_up = give_up

    def write(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
              done: np.ndarray) -> float | None:
        """Store ``len(obs)`` transitions; returns seconds spent waiting for the lock (None: gave up)."""
        if self._lock is None:
            self._put(obs, action, reward, next_obs, done)
            return 0.0
        t0 = time.perf_counter()
        if not acquire(self._lock, self._give_up):
            return None
        waited = time.perf_counter() - t0
        if self._holding is not None:
            self._holding[0] = 1
        try:
            self._put(obs, action, reward, next_obs, done)
        finally:
            if self._holding is not None:
                self._holding[0] = 0
            self._lock.release()
        return waited

    def _put(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, next_obs: np.ndarray,
             done: np.ndarray) -> None:
        n, cap, ring = len(obs), self.capacity, self.ring
        w = int(self._widx[ring])
        start = ring * cap + w % cap
        first = min(n, cap - w % cap)
        for name, values in zip(FIELDS, (obs, action, reward, next_obs, done), strict=True):
            dst = self._a[name]
            dst[start:start + first] = values[:first]
            if first < n:  # wrap around to the ring's first slot
                dst[ring * cap:ring * cap + n - first] = values[first:]
        self._widx[ring] = w + n  # publish: only now may the learner read these slots


@dataclass
class SampleStats:
    """What sampling cost, accumulated by a :class:`ReplayReader`."""

    samples: int = 0
    lock_wait_s: float = 0.0
    lock_acquires: int = 0
    redrawn: int = 0  # lockfree: slots a writer lapped while they were copied, drawn again


class ReplayReader:
    """The learner's side of the replay: uniform samples into preallocated staging arrays.

    ``chunk`` is the most transitions one ``write`` stores (an actor's boards); in ``lockfree``
    mode the oldest ``chunk`` slots of a full ring are never drawn, because a write in progress may
    be overwriting them.
    """

    def __init__(self, arrays: dict[str, np.ndarray], rings: int, capacity: int, chunk: int, batch: int,
                 lock: Any = None, check: Callable[[], None] = lambda: None, lock_timeout_s: float = 30.0,
                 seed: int = 0, out: dict[str, np.ndarray] | None = None) -> None:
        self._a = arrays
        self._widx = arrays["widx"]
        self.rings = 1 if lock is not None else rings
        self.capacity = capacity
        self.chunk = chunk
        self.batch = batch
        self._lock = lock
        self._check = check
        self._lock_timeout_s = lock_timeout_s
        self.rng = np.random.default_rng(seed)
        # Staging arrays a sample is gathered into (``out``: the caller's, e.g. pinned host memory).
        self.out = out or {name: np.empty((batch, *arrays[name].shape[1:]), dtype=arrays[name].dtype) for name in FIELDS}
        self.stats = SampleStats()
        self.tracker = UnsampledTracker(self.rings, capacity)

    def published(self) -> int:
        """Transitions written so far, all rings together (a lock-free read)."""
        return int(self._widx[: self.rings].sum())

    def sample(self) -> np.ndarray | None:
        """Fill ``self.out`` with ``batch`` transitions; returns their slots, or None if too few."""
        if self._lock is not None:
            return self._sample_locked()
        return self._sample_lockfree()

    # The slow form: the lock is held from the size check to the last gather.
    def _sample_locked(self) -> np.ndarray | None:
        t0 = time.perf_counter()
        deadline = t0 + self._lock_timeout_s

        def give_up() -> bool:
            self._check()  # raises if an actor died
            if time.perf_counter() > deadline:
                raise ReplayLockTimeout(f"the replay lock was not free for {self._lock_timeout_s:.0f} s")
            return False

        acquire(self._lock, give_up)
        self.stats.lock_wait_s += time.perf_counter() - t0
        self.stats.lock_acquires += 1
        try:
            w = int(self._widx[0])
            size = min(w, self.capacity)
            if size < self.batch:
                return None
            self.tracker.observe(self._widx[:1].copy())
            slots = self.rng.integers(0, size, self.batch)
            for name in FIELDS:
                np.take(self._a[name], slots, axis=0, out=self.out[name])
        finally:
            self._lock.release()
        self.tracker.mark(slots)
        self.stats.samples += 1
        return slots

    def _sample_lockfree(self) -> np.ndarray | None:
        cap, rings = self.capacity, self.rings
        w = self._widx[:rings].copy()
        ring, logical = self._draw(w, self.batch)
        if ring is None:
            return None
        slots = ring * cap + logical % cap
        for name in FIELDS:
            np.take(self._a[name], slots, axis=0, out=self.out[name])
        # A writer that published past w2 may be writing chunk [w2, w2 + chunk) right now, which
        # overwrites logical indices below w2 + chunk - cap: anything copied from there is suspect.
        for _ in range(1000):
            w2 = self._widx[:rings].copy()
            bad = np.flatnonzero(logical < w2[ring] + self.chunk - cap)
            if bad.size == 0:
                break
            self.stats.redrawn += int(bad.size)
            new_ring, new_logical = self._draw(w2, bad.size)
            if new_ring is None:  # cannot happen: a ring only grows
                raise RuntimeError("replay shrank while sampling")
            ring[bad], logical[bad] = new_ring, new_logical
            slots[bad] = new_ring * cap + new_logical % cap
            for name in FIELDS:
                self.out[name][bad] = self._a[name][slots[bad]]
        else:
            raise RuntimeError("replay writers lapped the sampler 1000 times in a row")
        self.tracker.observe(w2)  # before marking, so slots drawn from the newer window stay marked
        self.tracker.mark(slots)
        self.stats.samples += 1
        return slots

    def _draw(self, w: np.ndarray, n: int) -> tuple[np.ndarray | None, np.ndarray]:
        """``n`` uniform (ring, logical index) pairs over the readable slots of every ring."""
        lo = np.maximum(w - (self.capacity - self.chunk), 0)
        counts = w - lo
        ends = np.cumsum(counts)
        if ends[-1] < self.batch:
            return None, lo
        u = self.rng.integers(0, ends[-1], n)
        if self.rings == 1:
            return np.zeros(n, dtype=np.int64), lo[0] + u
        ring = np.searchsorted(ends, u, side="right")
        return ring, u + (lo - ends + counts)[ring]


def _slot_ranges(ring: int, capacity: int, lo: int, hi: int) -> list[tuple[int, int]]:
    """The slots of logical indices ``[lo, hi)`` of ``ring`` (hi - lo <= capacity) as at most two slices."""
    if hi <= lo:
        return []
    base, a, n = ring * capacity, lo % capacity, hi - lo
    if a + n <= capacity:
        return [(base + a, base + a + n)]
    return [(base + a, base + capacity), (base, base + a + n - capacity)]


class UnsampledTracker:
    """Counts transitions overwritten before the learner ever sampled them ("queue drops").

    The learner marks the slots it samples; each time it looks at the write indices, the slots
    rewritten since the last look are checked and cleared. Transitions written and overwritten
    between two looks were never visible at all and count too.
    """

    def __init__(self, rings: int, capacity: int) -> None:
        self.capacity = capacity
        self.sampled = np.zeros(rings * capacity, dtype=bool)
        self.seen = np.zeros(rings, dtype=np.int64)
        self.overwritten = 0  # transitions that left a ring
        self.unsampled = 0  # of those, never sampled

    def observe(self, w: np.ndarray) -> None:
        cap = self.capacity
        for ring in np.flatnonzero(w > self.seen):
            old, new = int(self.seen[ring]), int(w[ring])
            gone_lo, gone_hi = max(0, old - cap), max(0, new - cap)
            if gone_hi > gone_lo:
                self.overwritten += gone_hi - gone_lo
                visible_hi = min(gone_hi, old)  # was in the ring at the last look
                for a, b in _slot_ranges(int(ring), cap, gone_lo, visible_hi):
                    self.unsampled += (b - a) - int(np.count_nonzero(self.sampled[a:b]))
                self.unsampled += max(0, gone_hi - old)
            for a, b in _slot_ranges(int(ring), cap, max(old, new - cap), new):
                self.sampled[a:b] = False
            self.seen[ring] = new

    def mark(self, slots: np.ndarray) -> None:
        self.sampled[slots] = True


# -- weights -------------------------------------------------------------------------------------


class SeqLock:
    """A version counter for one writer and many readers (``counter`` is a shared int64[1]).

    The writer makes it odd while it writes and even when done; a reader that saw the same even
    value before and after its copy got a consistent copy. Published version = counter // 2.
    """

    def __init__(self, counter: np.ndarray) -> None:
        self._c = counter

    def begin(self) -> None:
        self._c[0] += 1

    def end(self) -> None:
        self._c[0] += 1

    def read(self) -> int:
        return int(self._c[0])

    @property
    def version(self) -> int:
        return int(self._c[0]) // 2
