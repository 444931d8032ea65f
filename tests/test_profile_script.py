"""``rlperf profile -- python SCRIPT``: a user's own loop, with or without the phase API.

The loops in tests/foreign/ were written for these tests as a user would write them: each plants
one item of the bottleneck checklist in an otherwise clean DQN loop (common.py), and clean.py
plants none. The advisor must name the planted one first, pointing at the planted function, and
find nothing in the clean loop.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlperf.cli import main
from rlperf.instruments.fixes import VERIFIABLE

FOREIGN = Path(__file__).resolve().parent / "foreign"
ROOT = Path(__file__).resolve().parents[1]


def profile(tmp_path: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """``python -m rlperf profile --out TMP ARGS`` in its own process (it starts the script's child)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    return subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(tmp_path), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=tmp_path)


def record_of(tmp_path: Path) -> dict:
    """The record of the one run directory under ``tmp_path``."""
    (record,) = tmp_path.glob("*/run.json")
    return json.loads(record.read_text())


PLANTED = [
    # script, the finding's reference, where it must point (file:function of the offending line)
    ("item_push.py", "§1", "item_push.py:", "(push)"),
    ("many_updates.py", "§3", "common.py:", "(run)"),
    ("hard_copy.py", "§7", "hard_copy.py:", "(copy_target)"),
    ("print_every_step.py", "§9", "print_every_step.py:", "(act_and_report)"),
    ("python_sample.py", "§2", "common.py:", "(run)"),
    ("autograd_act.py", "§8", "autograd_act.py:", "(act_with_grad)"),
    ("sync_vector.py", "§5", None, None),
    ("gc_pauses.py", "§13", None, None),
]


@pytest.mark.parametrize(("script", "section", "file", "function"), PLANTED, ids=[p[0] for p in PLANTED])
def test_the_planted_bottleneck_is_named_first(script: str, section: str, file: str | None, function: str | None,
                                               tmp_path: Path) -> None:
    proc = profile(tmp_path, "--json", "--", "python", str(FOREIGN / script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)  # --json: the record alone on stdout; the script's own output went to stderr
    findings = record["profile"]["advisor"]["findings"]
    assert findings, f"{script}: no finding"
    first = findings[0]
    assert first["reference"].startswith(f"docs/bottlenecks.md {section} ("), [f["title"] for f in findings]
    assert first["fix"] and first["evidence"]
    if file is not None:
        assert file in first["where"] and first["where"].endswith(function), first["where"]
    # the fix is the script's, at its line: no knob of rlperf's loop, no compare line that does not run the script
    assert first["knob"] is None
    assert first["command"] == (f"rlperf profile --verify 1 -- python {FOREIGN / script}"
                                if first["id"] in VERIFIABLE else None)
    assert record["kind"] == "external" and record["exit_code"] == 0 and record["status"] == "completed"


def test_a_finding_on_a_script_names_the_line_to_change_not_a_knob_of_rlperf(tmp_path: Path) -> None:
    # it said "try: --set buffer.push=batch" and "verify: rlperf compare fast --vs buffer.push=loop":
    # a knob and a run of rlperf's own loop, neither of which changes or measures the script
    proc = profile(tmp_path, "--", "python", str(FOREIGN / "item_push.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())
    assert "1. Per-item host copies in the loop" in out, out[-3000:]
    assert "fix at item_push.py:" in out and "(push): copy the whole batch at once" in out, out[-3000:]
    assert "--set" not in out and "rlperf compare" not in out and "try:" not in out, out[-3000:]


@pytest.mark.parametrize("script", ["blas_pools.py", "pool_workers.py"])
def test_thread_pools_that_outnumber_the_cpus_are_named_with_their_fix(script: str, tmp_path: Path) -> None:
    # numpy's BLAS pool and torch's OpenMP pool each at the CPU count, or workers each with a full BLAS
    # pool: the threads busy at once (measured) outnumber the CPUs; the record lists every pool
    if len(os.sched_getaffinity(0)) > 4:
        pytest.skip("the planted pools are sized for a machine of a few CPUs")
    (tmp_path / "planted").mkdir()
    (tmp_path / "capped").mkdir()
    proc = profile(tmp_path / "planted", "--json", "--", "python", str(FOREIGN / script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    threads = record["profile"]["threads"]
    assert threads["cpus"] == len(os.sched_getaffinity(0)) and threads["loadavg_1m"] >= 0
    assert any(p["package"] == "numpy" and p["api"] == "blas" and p["threads"] > 1 and p["version"]
               for p in threads["pools"]), threads
    assert threads["census"]["oversubscribed_s"] > 0 and threads["census"]["counts"] >= 2, threads
    findings = record["profile"]["advisor"]["findings"]
    assert [f["id"] for f in findings][:1] == ["threads"], [(f["id"], f["evidence"]) for f in findings]
    first = findings[0]
    assert "numpy's openblas" in first["evidence"] and "threadpool_limits(1)" in first["fix"], first
    # the line to change: the first import of a package whose pool it is (the variables go before it)
    first_import = next(i for i, line in enumerate((FOREIGN / script).read_text().splitlines(), 1)
                        if line.startswith(("import numpy", "import torch")))
    assert "OPENBLAS_NUM_THREADS=1" in first["fix"] and first["where"] == f"{script}:{first_import} (<module>)", first
    if script == "pool_workers.py":
        assert "worker processes" in first["evidence"], first["evidence"]
    # the clean twin: the pools capped as the fix says (pool_workers.py by the variable before its import)
    proc = profile(tmp_path / "capped", "--json", "--", "python", str(FOREIGN / script), "--capped")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    assert all(p["threads"] == 1 for p in record["profile"]["threads"]["pools"]), record["profile"]["threads"]
    assert "threads" not in [f["id"] for f in record["profile"]["advisor"]["findings"]], record["profile"]["threads"]


def test_threads_beyond_the_cpus_are_named(tmp_path: Path) -> None:
    if (os.cpu_count() or 1) >= 8:
        pytest.skip("the planted 8 threads are not more than this machine's CPUs")
    proc = profile(tmp_path, "--json", "--", "python", str(FOREIGN / "threads.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    findings = json.loads(proc.stdout)["profile"]["advisor"]["findings"]
    assert [f["id"] for f in findings][:1] == ["threads"]


def test_a_clean_loop_with_the_phase_api_gets_its_phase_table_and_no_finding(tmp_path: Path) -> None:
    proc = profile(tmp_path, "--", "python", str(FOREIGN / "clean.py"), "--steps", "200")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "step 100: loss" in out  # the script's own output, passed through
    assert "your loop's phases" in out and "select" in out and "train" in out
    assert "● = your code" in " ".join(out.split()) and "no finding" in out
    record = record_of(tmp_path)
    assert record["kind"] == "external" and set(record["phases"]) == {"select", "step", "push", "train", "log"}
    assert record["timing"]["measured_steps"] == 190 and record["timing"]["vector_step"]["p50_ms"] > 0
    assert record["profile"]["advisor"]["findings"] == [] and record["script"]["phase_timers"] == 1
    own = [row["function"] for row in record["profile"]["cprofile"]["top"] if row["own"]]
    assert any("common.py" in name and "(run)" in name for name in own)
    assert not any("rlperf/" in name for name in own)
    assert not any("instruments/child.py" in row["function"] for row in record["profile"]["cprofile"]["top"])


def test_a_script_without_the_api_gets_a_profile_and_is_told_how_to_get_phases(tmp_path: Path) -> None:
    script = tmp_path / "slow_loop.py"
    script.write_text("import sys\nprint('hello from the script')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n")
    proc = profile(tmp_path, "--", "python", str(script))
    assert proc.returncode == 3  # the script's exit code
    assert "hello from the script" in proc.stdout and "to stderr" in proc.stderr
    assert "no phase timings: the script does not use rlperf.PhaseTimer" in " ".join(proc.stdout.split())
    record = record_of(tmp_path)
    assert record["status"] == "failed" and record["exit_code"] == 3 and "profile.prof" in os.listdir(record["run_dir"])


def test_a_timer_that_only_counts_steps_is_not_called_no_timer(tmp_path: Path) -> None:
    # a callback's PhaseTimer with step_done() and no phase: "the script does not use
    # rlperf.PhaseTimer" was false, and its steps are the advisor's
    script = tmp_path / "steps_only.py"
    script.write_text("import rlperf\nt = rlperf.PhaseTimer('cpu')\nfor i in range(200):\n"
                      "    sum(range(1000))\n    t.step_done()\n")
    proc = profile(tmp_path, "--", "python", str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = " ".join(proc.stdout.split())
    assert "does not use rlperf.PhaseTimer" not in out
    assert "the script's rlperf.PhaseTimer timed no phase (200 timer.step_done() calls" in out
    assert record_of(tmp_path)["script"]["steps"] == {"count": 200, "basis": "timer.step_done() calls"}


def test_python_dash_m_runs_a_module(tmp_path: Path) -> None:
    package = tmp_path / "foreignpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint('module argv', sys.argv[1:])\n")
    proc = profile(tmp_path, "--", "python", "-m", "foreignpkg.train", "--lr", "3")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "module argv ['--lr', '3']" in proc.stdout


SHADOWED_LOOP = """
import rlperf

timer = rlperf.PhaseTimer("cpu")
total = 0
for t in range(2000):
    with timer.phase("step"):
        total += sum(i * i for i in range(50))
    timer.step_done()
print("total", total)
"""


def _shadow_the_standard_library(folder: Path, env: dict[str, str]) -> None:
    """A file in ``folder`` for every module of the standard library the loop above does not import
    under plain python: importing one says so on stderr and fails as a missing module would."""
    used = subprocess.run([sys.executable, "-c", "import sys\n" + SHADOWED_LOOP + "print(*sys.modules)"],
                          capture_output=True, text=True, env=env, check=True).stdout.split()
    roots = {name.split(".")[0] for name in used}
    for name in sorted(sys.stdlib_module_names - roots - set(sys.builtin_module_names)):
        if not name.startswith("_"):
            (folder / f"{name}.py").write_text(
                f"import sys\nsys.stderr.write('SHADOWED {name}\\n')\nraise ModuleNotFoundError('{name}')\n")


@pytest.mark.parametrize("form", ["script", "module"])
def test_files_named_like_the_standard_library_are_the_scripts_own_not_rlperfs(tmp_path: Path, form: str) -> None:
    # profile.py, csv.py, trace.py beside a script (and in the working directory) are the script's: python
    # SCRIPT never imports them unless the script does, and rlperf (whose profile needs cProfile, pstats,
    # tracemalloc...) must not pick them up for its own, nor run them
    folder = tmp_path / "project"
    (folder / "loop").mkdir(parents=True)
    (folder / "loop" / "__init__.py").write_text("")
    (folder / "loop" / "train.py").write_text(SHADOWED_LOOP)
    (folder / "train.py").write_text(SHADOWED_LOOP)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    _shadow_the_standard_library(folder, env)
    target = ["train.py"] if form == "script" else ["-m", "loop.train"]
    alone = subprocess.run([sys.executable, *target], capture_output=True, text=True, env=env, cwd=folder, timeout=120)
    assert alone.returncode == 0 and "total" in alone.stdout, alone.stderr[-2000:]
    proc = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(tmp_path / "runs"), "--", "python",
                           *target], capture_output=True, text=True, env=env, cwd=folder, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shadowed = {line for line in proc.stderr.splitlines() if line.startswith("SHADOWED")}
    assert shadowed <= {line for line in alone.stderr.splitlines() if line.startswith("SHADOWED")}, shadowed
    assert "total" in proc.stdout and "your loop's phases" in proc.stdout
    record = record_of(tmp_path / "runs")
    assert record["status"] == "completed" and record["profile"]["cprofile"]["top"]


def test_the_working_directory_is_not_on_a_scripts_path_elsewhere(tmp_path: Path) -> None:
    # python sub/train.py puts sub/ first on sys.path, not the working directory: a module beside the
    # working directory is not importable by the script, under rlperf as without it
    (tmp_path / "helper.py").write_text("VALUE = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "train.py").write_text("import helper\nprint(helper.VALUE)\n")
    alone = subprocess.run([sys.executable, "sub/train.py"], capture_output=True, text=True, cwd=tmp_path)
    proc = profile(tmp_path, "--", "python", "sub/train.py")
    assert alone.returncode == proc.returncode == 1
    assert "No module named 'helper'" in alone.stderr and "No module named 'helper'" in proc.stderr


WORKER = """
import builtins, multiprocessing as mp, sys
import rlperf

def actor(n):
    print("worker profiled:", sys.getprofile() is not None, "imports wrapped:",
          getattr(builtins.__import__, "__module__", "builtins") != "builtins", flush=True)
    timer = rlperf.PhaseTimer("cpu")
    for t in range(n):
        with timer.phase("act"):
            sum(i * i for i in range(500))
        timer.step_done()

if __name__ == "__main__":
    mp.set_start_method("{method}")
    p = mp.Process(target=actor, args=(300,))
    p.start()
    p.join()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_phase_timer_in_a_worker_process_gives_the_phase_table_and_the_worker_runs_unprofiled(
        tmp_path: Path, method: str) -> None:
    # the loop of an actor process (multiprocessing) with rlperf.PhaseTimer: its phases are the table
    # (the profile said "the script does not use rlperf.PhaseTimer"), and a forked worker does not run on
    # under the cProfile and import hooks it inherited (its loop ran 3-4 times slower than alone)
    script = tmp_path / "actors.py"
    script.write_text(WORKER.replace("{method}", method))
    proc = profile(tmp_path, "--", "python", str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "worker profiled: False imports wrapped: False" in proc.stdout
    assert "your loop's phases" in proc.stdout and "act" in proc.stdout
    assert "which the script started" in " ".join(proc.stdout.split())
    record = record_of(tmp_path)
    assert record["timing"]["measured_steps"] + record["timing"]["warmup_steps"] == 300
    assert isinstance(record["script"]["phase_timer_process"], int) and set(record["phases"]) == {"act"}


POOL = """
import multiprocessing as mp
import rlperf

def actor(n):
    timer = rlperf.PhaseTimer("cpu")
    for t in range(n):
        with timer.phase("act"):
            sum(i * i for i in range(500))
        timer.step_done()
    return n

if __name__ == "__main__":
    mp.set_start_method("{method}")
    with mp.Pool(2) as pool:  # its __exit__ is terminate(): SIGTERM to the workers
        print("done", sum(pool.map(actor, [300] * 4, chunksize=1)), flush=True)
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_pools_workers_ended_by_terminate_keep_their_timers_and_print_nothing(tmp_path: Path,
                                                                               method: str) -> None:
    # `with Pool(...)` ends its workers with SIGTERM: a forked worker raised rlperf's own stop in the
    # script's handler it inherited (a traceback per worker, timers lost); a spawned one died with its
    # timers unwritten ("the script does not use rlperf.PhaseTimer")
    script = tmp_path / "pool.py"
    script.write_text(POOL.replace("{method}", method))
    proc = profile(tmp_path, "--", "python", str(script))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "done 1200" in proc.stdout and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "your loop's phases" in proc.stdout
    record = record_of(tmp_path)
    assert record["timing"]["measured_steps"] == 300 and set(record["phases"]) == {"act"}


def test_a_process_with_a_timer_keeps_what_it_wrote_when_sigterm_ends_it(tmp_path: Path) -> None:
    # a process the script started: its timers written as it steps, SIGTERM's default left as it is (a Pool
    # worker's SIGTERM handler, reached just before the worker blocked on the task queue's lock, never ran:
    # the worker waited there for ever, 4 of 62 spawn-Pool profiles beside hog 2)
    code = ("import os, signal, time, rlperf\n"
            "t = rlperf.PhaseTimer('cpu')\n"
            "for _ in range(60):\n"
            "    with t.phase('act'):\n"
            "        time.sleep(0.005)\n"
            "    t.step_done()\n"
            "assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL\n"
            "os.kill(os.getpid(), signal.SIGTERM)\n"
            "time.sleep(30)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLPERF_SUBPROCESS_TIMERS": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGTERM and proc.stderr == ""
    (written,) = tmp_path.glob("timers-*.json")
    (record,) = json.loads(written.read_text())
    # written at least every tenth of its age (0.05 s at the least): 60 steps of 5 ms or more, at most the
    # last 0.05 s of them lost
    assert 45 <= record["timing"]["measured_steps"] + record["timing"]["warmup_steps"] <= 60, record["timing"]
    assert set(record["phases"]) == {"act"}


def test_a_forked_worker_ended_by_sigterm_keeps_the_steps_its_timer_wrote(tmp_path: Path) -> None:
    # a fork inherits the script's registry: its timer's steps must still be written as it steps
    script = tmp_path / "forked.py"
    script.write_text("import multiprocessing as mp, os, signal, time\nimport rlperf\n\n"
                      "def actor():\n    t = rlperf.PhaseTimer('cpu')\n    for _ in range(60):\n"
                      "        with t.phase('act'):\n            time.sleep(0.005)\n        t.step_done()\n"
                      "    os.kill(os.getpid(), signal.SIGTERM)\n    time.sleep(30)\n\n"
                      "if __name__ == '__main__':\n    p = mp.get_context('fork').Process(target=actor)\n"
                      "    p.start()\n    p.join()\n    print('exit', p.exitcode)\n")
    proc = profile(tmp_path, "--", "python", str(script))
    assert proc.returncode == 0 and "exit -15" in proc.stdout, proc.stderr[-3000:]
    timing = record_of(tmp_path)["timing"]
    assert 45 <= timing["measured_steps"] + timing["warmup_steps"] <= 60, timing


def test_ctrl_c_stops_the_script_and_keeps_its_profile(tmp_path: Path) -> None:
    script = tmp_path / "forever.py"
    script.write_text("import time\nprint('started', flush=True)\nwhile True:\n    time.sleep(0.01)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "rlperf", "profile", "--out", str(tmp_path), "--", "python",
                             str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" in err
    record = record_of(tmp_path)
    assert record["status"] == "interrupted" and record["profile"]["cprofile"]["top"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--", "bash", "run.sh"], "rlperf profile runs Python scripts, not 'bash'"),
        (["--", "python", "no_such_script.py"], "no such script: no_such_script.py"),
        (["--", "python", "-m", "no_such_module_here"], "no module named 'no_such_module_here'"),
        (["--", "python", "-c", "print(1)"], "python option -c is not supported"),
        (["--config", "naive", "--", "python", "x.py"], "--config applies to rlperf's own loop"),
        (["--tensorboard", "--", "python", "x.py"], "--tensorboard applies to rlperf's own loop"),
        (["python", "x.py"], "put your command after --"),
        (["--"], "nothing to run after --"),  # not rlperf's own loop with the default config
    ],
)
def test_bad_commands_are_one_line_exit_2_and_write_nothing(args: list[str], message: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.py").write_text("print(1)\n")
    with pytest.raises(SystemExit) as exc:
        main(["profile", "--out", str(tmp_path / "runs"), *args])
    out, err = capsys.readouterr()
    assert exc.value.code == 2 and out == "" and err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "runs").exists()


def test_the_apis_record_goes_through_compare_and_the_gate(tmp_path: Path, capsys) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    dirs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(FOREIGN / "clean.py"), "--steps", "150", "--save", str(tmp_path)],
                              capture_output=True, text=True, env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr[-2000:]
        dirs.append(proc.stdout.strip().splitlines()[-1])
    record = json.loads((Path(dirs[0]) / "run.json").read_text())
    assert record["kind"] == "external" and record["totals"]["env_steps"] == 150 * 64
    with pytest.raises(SystemExit) as exc:
        main(["compare", dirs[0], dirs[1], "--json"])
    out, _ = capsys.readouterr()
    assert exc.value.code == 0
    rows = {r["metric"] for r in json.loads(out)["rows"]}
    assert {"phase.select", "phase.train", "env_steps_per_s", "s_per_1000_env_steps"} <= rows
    with pytest.raises(SystemExit) as exc:  # the gate reads external records (one against one is too few, and says so)
        main(["compare", dirs[0], "--candidate", dirs[1], "--fail-if-slower", "90%"])
    _, err = capsys.readouterr()
    assert exc.value.code == 2 and "1 baseline and 1 candidate runs have no spread to test" in err


def test_torch_and_py_spy_on_a_script_that_uses_the_api(tmp_path: Path) -> None:
    from rlperf.instruments.profilers import find_pyspy

    extra = ["--py-spy"] if find_pyspy() is not None else []
    proc = profile(tmp_path, "--torch", *extra, "--", "python", str(FOREIGN / "clean.py"), "--steps", "60")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "py-spy> " not in proc.stdout and "py-spy> " not in proc.stderr
    record = record_of(tmp_path)
    torch_section = record["profile"]["torch"]
    assert torch_section["recorded"] and torch_section["top_ops"] and torch_section["steps"] == [11, 15]
    assert (Path(record["run_dir"]) / "trace.json").is_file()
    spy = record["profile"].get("py_spy") or {}
    if extra and "skipped" not in spy:
        assert spy["samples"] > 0 and (Path(record["run_dir"]) / "pyspy.svg").is_file()


def test_in_windows_the_table_is_scaled_to_the_whole_run(tmp_path: Path) -> None:
    # --cprofile-whole 0.05: cProfile whole for the first 0.05 s of the script's work, then windows (none
    # inside the optimizer's lazy torch._dynamo import: a window there read as the loop once gave 6 steps of 150)
    # 1,500 steps: four windows or more (150 steps gave one window of 0.05 s, and counts of 92-206 for 150 beside
    # busy processes; at 1,500, 0.88-0.92x quiet and 0.90-1.14x beside hog 2)
    proc = profile(tmp_path, "--json", "--no-plot", "--cprofile-whole", "0.05", "--", "python", str(FOREIGN / "item_push.py"),
                   "--steps", "1500")
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    windows = record["profile"]["cprofile"]["windows"]
    assert not windows["whole"] and windows["windows"] >= 3 and windows["scale"] > 1.2
    assert windows["recorded_calls"] < record["profile"]["cprofile"]["total_calls"]
    assert record["script"]["steps"]["count"] == pytest.approx(1500, rel=0.3)
    assert record["profile"]["advisor"]["findings"][0]["id"] == "host_copy"


def test_a_lazy_import_of_an_installed_package_is_left_out_of_the_profile(tmp_path: Path) -> None:
    # torch's optimizer imports torch._dynamo at its first step (0.7 s alone, 1.1 s under cProfile):
    # cProfile pauses for an installed package's import, and the loop's calls keep their caller
    site = tmp_path / "site-packages"
    (site / "slowpkg").mkdir(parents=True)
    (site / "slowpkg" / "__init__.py").write_text(
        "import time\n\ndef spin():\n    return sum(range(100))\n\nend = time.perf_counter() + 0.4\n"
        "while time.perf_counter() < end:\n    spin()\n")
    script = tmp_path / "lazy.py"
    script.write_text(
        "def step(i):\n    return i * 2\n\n\ndef main():\n    for i in range(20000):\n        step(i)\n"
        "        if i == 10000:\n            import slowpkg  # noqa\n\n\nmain()\n")
    out = tmp_path / "runs"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), str(site), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.run([sys.executable, "-m", "rlperf", "profile", "--out", str(out), "--json", "--no-plot", "--",
                           "python", str(script)], capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)
    windows = record["profile"]["cprofile"]["windows"]
    assert windows["imports_s"] >= 0.35, windows
    import pstats

    stats = pstats.Stats(str(Path(record["run_dir"]) / "profile.prof")).stats  # type: ignore[attr-defined]
    assert not any("slowpkg" in key[0] for key in stats)
    (step,) = [key for key in stats if key[2] == "step" and key[0] == str(script)]
    assert stats[step][1] == 20000 and {c[2]: v[0] for c, v in stats[step][4].items()} == {"main": 20000}
    from rlperf.report.profile import script_overhead_line

    assert "paused for" in (script_overhead_line(record) or "")


@pytest.mark.parametrize("options", [[], ["--json", "--no-plot"], ["--top", "3"]], ids=["bare", "json", "other"])
def test_the_script_runs_once_whether_it_started_before_the_command_line_was_parsed(tmp_path: Path,
                                                                                    options: list[str]) -> None:
    # rlperf profile [--out DIR] [--json] [--quiet] [--no-plot] -- python SCRIPT starts the script's
    # child before Typer is imported; the command adopts it instead of starting another
    script = tmp_path / "once.py"
    script.write_text("import os, sys\nwith open(sys.argv[1], 'a') as f:\n    f.write(f'{os.getpid()}\\n')\n")
    ran = tmp_path / "ran.txt"
    proc = profile(tmp_path, *options, "--", "python", str(script), str(ran))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(ran.read_text().split()) == 1
    assert len(list(tmp_path.glob("once-*/run.json"))) == 1


def test_a_child_started_early_that_no_command_adopts_is_stopped(tmp_path: Path, monkeypatch) -> None:
    from rlperf.instruments import script as script_module

    slow = tmp_path / "slow.py"
    started = tmp_path / "started.txt"
    slow.write_text(f"import time\nopen({str(started)!r}, 'w').close()\ntime.sleep(60)\n")
    monkeypatch.chdir(tmp_path)
    script_module.start_early(["--out", str(tmp_path / "runs"), "--", "python", str(slow)])
    early = script_module._EARLY
    assert early is not None
    deadline = time.monotonic() + 30
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    script_module.discard_early()
    assert early.proc.poll() is not None and not Path(early.scratch.name).exists()
    assert script_module._EARLY is None
    script_module.start_early([f"--out={tmp_path / 'runs'}", "--", "python", str(slow)])  # --out=DIR as --out DIR
    early = script_module._EARLY
    assert early is not None
    script_module.discard_early()
    assert early.proc.poll() is not None and not Path(early.scratch.name).exists()
    script_module.start_early(["--top", "3", "--", "python", str(slow)])  # an option the early start leaves alone
    script_module.start_early(["--", "python", str(tmp_path / "missing.py")])  # the command says why
    assert script_module._EARLY is None


def test_cprofile_whole_inf_profiles_the_whole_run(tmp_path: Path) -> None:
    proc = profile(tmp_path, "--json", "--no-plot", "--cprofile-whole", "inf", "--", "python", str(FOREIGN / "clean.py"),
                   "--steps", "40")
    assert proc.returncode == 0, proc.stderr[-3000:]
    windows = json.loads(proc.stdout)["profile"]["cprofile"]["windows"]
    assert windows["whole"] and "scale" not in windows


def test_a_negative_cprofile_whole_is_one_line_exit_2(tmp_path: Path) -> None:
    proc = profile(tmp_path, "--cprofile-whole", "-1", "--", "python", str(FOREIGN / "clean.py"))
    assert proc.returncode == 2 and "--cprofile-whole must be 0 or more seconds" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("*/run.json"))


def test_cprofile_whole_without_a_script_is_refused(tmp_path: Path) -> None:
    proc = profile(tmp_path, "--cprofile-whole", "5", "--steps", "256")
    assert proc.returncode == 2 and "--cprofile-whole applies to a script's profile" in proc.stderr
    assert "Traceback" not in proc.stderr and not list(tmp_path.glob("*/run.json"))


def test_a_script_that_dies_before_writing_its_profile_is_described_truly(tmp_path: Path) -> None:
    """A segfault 0.2 s in, before any snapshot held a phase timer: rlperf does not claim both that the
    script has no PhaseTimer and that the phase timings are its last snapshot; it says what it knows."""
    script = tmp_path / "crash.py"
    script.write_text("import os, signal, time\nt = time.perf_counter()\nwhile time.perf_counter() - t < 0.2:\n"
                      "    pass\nos.kill(os.getpid(), signal.SIGSEGV)\n")
    proc = profile(tmp_path, "--", "python", str(script))
    text = " ".join((proc.stdout + proc.stderr).split())
    assert record_of(tmp_path)["exit_code"] == 139, proc.stderr[-3000:]
    assert "does not use rlperf.PhaseTimer" not in text
    assert "the phase timings are its last snapshot" not in text
    assert "killed by SIGSEGV before it could write its profile; its last snapshot held no phase timer" in text
    assert "no phase timings: the script ended before it could write its profile" in text
