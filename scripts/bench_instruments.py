"""What each instrument of ``rlperf profile`` costs, as ratios measured side by side in one invocation.

    python scripts/bench_instruments.py                       # default config, CPU or GPU
    python scripts/bench_instruments.py --steps 128000 --repeats 7 --json bench.json

Every variant trains the same config with the same seed for the same number of env steps, so
vector step i does the same work in every variant and every round. Variants run round-robin for
``--repeats`` rounds; a variant's figure is the sum, over blocks of ``--block`` vector steps
(after the phase-timer warm-up, without the last step), of each block's fastest time across
rounds. Other processes only ever add time, and on a shared machine they hit different blocks in
different rounds, so the per-block minimum is robust where the median of whole runs is not (that
is reported too). Blocks, not single steps: py-spy's samples land on a few steps of each block,
and a per-step minimum would pick the steps it happened not to sample.

- timers off       -- ``run.timing=off``: the bare loop
- phase timers     -- ``run.timing=auto``: what ``rlperf train`` always does
- + cProfile       -- phase timers, cProfile and the GC monitor (``rlperf profile``'s default)
- + torch.profiler -- phase timers, ``phase:*`` ranges and torch.profiler's schedule (``--torch``)
- + py-spy         -- phase timers in a child process under ``py-spy record`` (``--py-spy``),
  against the same child without py-spy (both pay the same process start)
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from rlperf.config import Config, config_from
from rlperf.instruments.profiling import Instruments
from rlperf.instruments.profilers import find_pyspy, pyspy_command, pyspy_env
from rlperf.system import cpu_model
from rlperf.run.lifecycle import train_run

IN_PROCESS = ("timers off", "phase timers", "+ cProfile", "+ torch.profiler")


def build(config: str, steps: int, overrides: list[str], timing: str) -> Config:
    cfg = config_from(config, [*overrides, f"run.timing={timing}", "train.checkpoint=false"], steps=steps)
    return cfg


def loop_steps(cfg: Config, variant: str) -> list[float]:
    """One run of ``variant``: the wall seconds of each vector step after warm-up (the last one excluded)."""
    with tempfile.TemporaryDirectory(prefix="rlperf-bench-") as tmp:
        inst = Instruments(cfg, cprofile=variant == "+ cProfile", gc=variant == "+ cProfile",
                           torch=variant == "+ torch.profiler", trace_path=Path(tmp) / "trace.json")
        train_run(cfg, out=tmp, quiet=True, dashboard=False, kind="bench", hooks=inst.hooks())
    warm = cfg.train.warmup_steps
    return inst.step_durations()[warm:-1]


def child_steps(args: argparse.Namespace, pyspy: str | None) -> list[float]:
    """The phase-timers variant in a fresh process, under py-spy when ``pyspy`` is given."""
    with tempfile.TemporaryDirectory(prefix="rlperf-bench-child-") as tmp:
        result = Path(tmp) / "result.json"
        child = [sys.executable, __file__, "--child", str(result), "--config", args.config, "--steps", str(args.steps)]
        for item in args.set:
            child += ["--set", item]
        cmd = pyspy_command(pyspy, Path(tmp) / "pyspy.json", child) if pyspy else child
        subprocess.run(cmd, check=True, env=pyspy_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return json.loads(result.read_text())["steps"]


def pyspy_works(pyspy: str) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = pyspy_command(pyspy, Path(tmp) / "probe.json", [sys.executable, "-c", "sum(range(10**6))"])
        done = subprocess.run(cmd, env=pyspy_env(), capture_output=True)
        return done.returncode == 0 and (Path(tmp) / "probe.json").is_file()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default")
    parser.add_argument("--steps", type=int, default=64_000, help="env transitions per run")
    parser.add_argument("--set", action="append", default=[], help="config override, repeatable")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--block", type=int, default=25, help="vector steps per block for the minimum")
    parser.add_argument("--no-py-spy", action="store_true")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        cfg = build(args.config, args.steps, args.set, "auto")
        Path(args.child).write_text(json.dumps({"steps": loop_steps(cfg, "phase timers")}))
        return

    configs = {v: build(args.config, args.steps, args.set, "off" if v == "timers off" else "auto") for v in IN_PROCESS}
    pyspy = None if args.no_py_spy else find_pyspy()
    if pyspy and not pyspy_works(pyspy):
        print("py-spy is on PATH but cannot sample here (ptrace refused?): skipping it", file=sys.stderr)
        pyspy = None
    runs: dict[str, list[list[float]]] = {v: [] for v in IN_PROCESS}
    if pyspy:
        runs["child, phase timers"] = []
        runs["child, + py-spy"] = []
    loop_steps(configs["phase timers"], "phase timers")  # pay lazy initialisation before anything is timed
    for r in range(args.repeats):
        for variant in IN_PROCESS:
            runs[variant].append(loop_steps(configs[variant], variant))
        if pyspy:
            runs["child, phase timers"].append(child_steps(args, None))
            runs["child, + py-spy"].append(child_steps(args, pyspy))
        print(f"round {r + 1}/{args.repeats}: " + ", ".join(f"{v} {sum(s[-1]):.3f} s" for v, s in runs.items()),
              file=sys.stderr)

    def blocks(run: list[float]) -> list[float]:
        return [sum(run[i:i + args.block]) for i in range(0, len(run), args.block)]

    best = {v: sum(min(block) for block in zip(*(blocks(run) for run in rs), strict=True)) for v, rs in runs.items()}
    median = {v: statistics.median(sum(run) for run in rs) for v, rs in runs.items()}
    rows = [("phase timers only", "timers off", "phase timers"),
            ("+ cProfile (and GC monitor)", "phase timers", "+ cProfile"),
            ("+ torch.profiler (window + phase ranges)", "phase timers", "+ torch.profiler")]
    if pyspy:
        rows.append(("+ py-spy (child process)", "child, phase timers", "child, + py-spy"))
    cfg = configs["phase timers"]
    device = "cuda" if cfg.run.device != "cpu" and torch.cuda.is_available() else "cpu"
    machine = torch.cuda.get_device_name() if device == "cuda" else cpu_model()
    print(
        f"\nconfig {args.config} {' '.join('--set ' + s for s in args.set)}, {args.steps:,} env steps "
        f"({math.ceil(args.steps / cfg.env.num_envs)} vector steps, {cfg.train.warmup_steps} warm-up), "
        f"per-{args.block}-step-block minimum over {args.repeats} rounds; {machine}, torch {torch.__version__}, "
        f"Python {platform.python_version()}\n"
    )
    print("| instrument | baseline s | with it s | ratio | ratio of medians |")
    print("|---|---:|---:|---:|---:|")
    results = []
    for label, base, variant in rows:
        ratio = best[variant] / best[base]
        ratio_median = median[variant] / median[base]
        results.append(
            {
                "instrument": label,
                "baseline_s": best[base],
                "with_s": best[variant],
                "ratio": ratio,
                "ratio_of_medians": ratio_median,
            }
        )
        print(f"| {label} | {best[base]:.3f} | {best[variant]:.3f} | {ratio:.3f} | {ratio_median:.3f} |")
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "config": args.config,
                    "steps": args.steps,
                    "set": args.set,
                    "repeats": args.repeats,
                    "machine": machine,
                    "device": device,
                    "runs": runs,
                    "results": results,
                },
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
