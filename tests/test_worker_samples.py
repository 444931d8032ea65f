"""The processes a script forks are sampled too: a cost that lives in a worker (a Pool's task, a
vector env's worker behind a pipe, an actor) is named with its file and line, from CPU-time samples
of each worker (rlperf.instruments.evidence.WorkerSampler), and its clean twin gets nothing.

The scripts are written here as a user would write them; FIX=1 runs the clean twin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

POOL = """
import multiprocessing as mp
import os
import numpy as np

FIX = os.environ.get("FIX") == "1"

class NoiseTable:
    def __init__(self, size=500_000):
        self.noise = np.random.default_rng(5).standard_normal(size, dtype=np.float32)

_TABLE = None

def init():
    global _TABLE
    _TABLE = NoiseTable()

def source():
    return _TABLE if FIX else NoiseTable()  # planted

def score(task):
    theta, seed = task
    x = theta + 0.1 * source().noise[seed * 10:seed * 10 + 64]
    for _ in range(3000):  # the task's own work: the initializer's table is a small part of a clean worker
        x = np.tanh(x + 0.01)
    return float(x.sum())

if __name__ == "__main__":
    theta = np.zeros(64)
    with mp.get_context("fork").Pool(2, initializer=init) as pool:
        for g in range(6):
            scores = pool.map(score, [(theta, g * 8 + k) for k in range(8)], chunksize=1)
            theta = theta + 0.01 * (np.asarray(scores) - np.mean(scores)).sum()
    print(theta.sum())
"""

PIPE = """
import math
import multiprocessing as mp
import os
import numpy as np

FIX = os.environ.get("FIX") == "1"
ANGLES = np.linspace(0, 2 * math.pi, 48, endpoint=False)
CENTERS = np.random.default_rng(0).uniform(-3, 3, (24, 2))

def scan(px, py):
    out = []
    for a in ANGLES.tolist():
        best = 5.0
        for cx, cy in CENTERS.tolist():  # planted
            d = math.hypot(cx - px - math.cos(a), cy - py - math.sin(a))
            if d < best:
                best = d
        out.append(best)
    return out

def scan_vector(px, py):
    p = np.stack([px + np.cos(ANGLES), py + np.sin(ANGLES)], 1)
    return np.linalg.norm(CENTERS[None] - p[:, None], axis=2).min(1).clip(max=5.0)

def worker(conn):
    x = y = 0.0
    while True:
        action = conn.recv()
        if action is None:
            return
        x, y = x + 0.01 * action, y - 0.01 * action
        conn.send(scan_vector(x, y) if FIX else scan(x, y))

if __name__ == "__main__":
    ctx = mp.get_context("fork")
    pairs = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=worker, args=(child,), daemon=True) for _, child in pairs]
    for p in procs:
        p.start()
    total = 0.0
    for t in range(700):
        for parent, _ in pairs:
            parent.send(t % 3 - 1)
        total += sum(float(np.mean(parent.recv())) for parent, _ in pairs)
    for parent, _ in pairs:
        parent.send(None)
    for p in procs:
        p.join()
    print(round(total, 3))
"""

ACTOR = """
import json
import multiprocessing as mp
import os
import tempfile
import numpy as np

FIX = os.environ.get("FIX") == "1"

def actor(path, out, steps):
    weights = json.load(open(path))
    w = np.asarray(weights["w"])
    obs = np.zeros(w.shape[0])
    for t in range(steps):
        if not FIX:
            weights = json.load(open(path))  # planted
            w = np.asarray(weights["w"])
        obs = np.tanh(obs @ w + 0.01 * t)
    out.put(float(obs.sum()))

if __name__ == "__main__":
    path = os.path.join(tempfile.mkdtemp(), "weights.json")
    with open(path, "w") as f:
        json.dump({"w": np.random.default_rng(1).normal(0, 0.1, (64, 64)).tolist()}, f)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=actor, args=(path, out, 900)) for _ in range(2)]
    for p in procs:
        p.start()
    print(sum(out.get() for _ in procs))
    for p in procs:
        p.join()
"""

PLANTED = [("pool_table.py", POOL, "(source)"), ("pipe_scan.py", PIPE, "(scan)"), ("actor_reload.py", ACTOR, "(actor)"),
           # started, not forked: sampled from their first line (rlperf/instruments/startup/sitecustomize.py)
           ("pool_table_spawn.py", POOL.replace('"fork"', '"spawn"'), "(source)"),
           ("pool_table_forkserver.py", POOL.replace('"fork"', '"forkserver"'), "(source)")]


def profile(tmp_path: Path, script: Path, fix: bool) -> dict:
    return profile_run(tmp_path, script, fix)[0]


def profile_run(tmp_path: Path, script: Path, fix: bool) -> tuple[dict, str]:
    """``rlperf profile --json -- python SCRIPT``: its record, and the script's own output (stderr, with --json)."""
    env = {**os.environ, "FIX": "1" if fix else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(tmp_path / "runs"), "--json", "--",
                           "python", str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


@pytest.mark.parametrize(("name", "source", "function"), PLANTED, ids=[p[0] for p in PLANTED])
def test_a_cost_in_a_forked_worker_is_named_at_its_line_and_its_clean_twin_gets_nothing(
        tmp_path: Path, name: str, source: str, function: str) -> None:
    script = tmp_path / name
    script.write_text(source)
    planted = next(i for i, line in enumerate(source.splitlines(), 1) if "# planted" in line)
    record = profile(tmp_path, script, fix=False)
    workers = record["profile"]["evidence"]["workers"]
    assert workers["processes"] >= 2 and workers["cpu_s"] > 0, workers
    findings = record["profile"]["advisor"]["findings"]
    assert findings, f"{name}: no finding"
    first = findings[0]
    assert first["id"] == "hot_spot" and "worker process" in first["evidence"], [(f["id"], f["where"]) for f in findings]
    assert first["where"] == f"{name}:{planted} {function}", first["where"]
    assert 0 < first["est_saving_s"] <= record["script"]["wall_s"]
    clean = profile(tmp_path, script, fix=True)
    assert clean["profile"]["advisor"]["findings"] == [], [(f["id"], f["where"]) for f in
                                                           clean["profile"]["advisor"]["findings"]]


NESTED = """
import multiprocessing as mp

def spin(n):
    total = 0
    for i in range(n):  # planted
        total += i % 7
    return total

def middle(n):
    with mp.get_context("fork").Pool(1) as pool:
        print(sum(pool.map(spin, [n] * 4)))
"""


CLOCKS = """
import multiprocessing as mp
import os
import sys
import time

from nested import middle

def measure(out):
    deltas = []
    for _ in range(300):  # 1 ms of this thread's CPU each: about 30 ticks of the sampler
        started, cpu = time.thread_time(), time.process_time()
        while time.thread_time() - started < 0.001:
            pass
        deltas.append(time.process_time() - cpu)
    out.put(sorted(deltas)[len(deltas) // 2])

if __name__ == "__main__":
    pid = os.fork()
    if pid == 0:  # a fork that execs at once: the program it runs keeps the fork's interval timers
        os.execv(sys.executable, [sys.executable, "-c", "import time\\nt = time.process_time()\\n"
                 "while time.process_time() - t < 0.5: pass\\nraise SystemExit(7)"])
    print("exec'd program ended with", os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    worker = ctx.Process(target=measure, args=(out,))
    worker.start()
    print("median process_time delta ms", round(out.get() * 1e3, 3))
    worker.join()
    print("worker exit code", worker.exitcode)
    actor = ctx.Process(target=middle, args=(1_500_000,))  # a worker that forks a worker of its own
    actor.start()
    actor.join()
"""


def test_sampled_workers_keep_their_clocks_exit_codes_and_exec_and_a_worker_s_fork_is_sampled(tmp_path: Path) -> None:
    # an armed setitimer(ITIMER_PROF) made process_time() step by 4 ms ticks on this machine (a 1 ms spin
    # read 0 or 4 ms), an interval timer left running at the end ends the process with SIGPROF, and one
    # survives exec: the program a fork execs at once must run unharmed
    (tmp_path / "nested.py").write_text(NESTED)
    script = tmp_path / "clocks.py"
    script.write_text(CLOCKS)
    record, out = profile_run(tmp_path, script, fix=False)
    assert "exec'd program ended with 7" in out, out[-2000:]
    delta = float(out.split("median process_time delta ms", 1)[1].split()[0])
    assert 0.9 <= delta <= 1.5, (delta, out[-2000:])
    assert "worker exit code 0" in out, out[-2000:]
    workers = record["profile"]["evidence"]["workers"]
    lines = {(Path(f).name, line): s for f, _, _, line, s in workers["lines"]}
    spin = sum(s for (f, line), s in lines.items() if f == "nested.py" and line in (6, 7))
    # the grandchild's loop, 0.15-0.35 s of CPU (the measuring worker and the exec'd program have the rest)
    assert spin > 0.1, lines


HIDDEN = """
import multiprocessing as mp
import sys

def which():
    return getattr(sys.modules.get("sitecustomize"), "MARK", None)

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print("worker's sitecustomize:", pool.apply(which))
"""


def test_a_started_process_runs_the_sitecustomize_that_rlperf_s_hides(tmp_path: Path, monkeypatch) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("MARK = 'the user s'\n")
    monkeypatch.setenv("PYTHONPATH", str(site))
    script = tmp_path / "hidden.py"
    script.write_text(HIDDEN)
    _, out = profile_run(tmp_path, script, fix=False)
    assert "worker's sitecustomize: the user s" in out, out[-2000:]


TORCH_SPAWN = """
import multiprocessing as mp
import torch

def rollout(seed):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(64, 64, generator=g)
    x = torch.randn(64, generator=g)
    total = 0.0
    for _ in range(2000):
        x = torch.tanh(w @ x)
        total += float(x[0])
    return total

if __name__ == "__main__":
    with mp.get_context("spawn").Pool(2) as pool:
        print(sum(pool.map(rollout, range(8))))
"""


def test_a_spawned_worker_s_imports_are_kept_apart_from_its_work(tmp_path: Path) -> None:
    """Each spawned worker imports torch anew (about a second of CPU): not a hot spot at ``import torch``."""
    script = tmp_path / "torch_spawn.py"
    script.write_text(TORCH_SPAWN)
    record = profile(tmp_path, script, fix=False)
    workers = record["profile"]["evidence"]["workers"]
    assert workers["imports_s"] > 0.3, workers
    assert not any(line == 2 for _, _, _, line, _ in workers["lines"]), workers["lines"]
    assert record["profile"]["advisor"]["findings"] == [], [(f["id"], f["where"]) for f in
                                                            record["profile"]["advisor"]["findings"]]
