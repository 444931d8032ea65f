"""rlperf train against Stable-Baselines3 DQN on the same Snake: wall time, env steps/s, time to a score.

    python scripts/bench_peers.py                          # default config vs SB3 with 1 and 16 envs (~15 min)
    python scripts/bench_peers.py --plot docs/learning_curves.png --out peers.json
    python scripts/bench_peers.py --quick --json           # what the test suite runs

One invocation runs, back to back on this machine:

- ``rlperf train`` on ``--config`` (default: the default config; its own env steps set the budget
  unless ``--steps`` is given), each repeat in its own process, logging every 10 vector steps so
  the learning curve is fine-grained. Its wall time is the record's ``totals.wall_s``.
- Stable-Baselines3 ``DQN("MlpPolicy", make_vec_env("rlperf/Snake-v0", n_envs=K))`` for each K of
  ``--sb3-envs``: SB3's standard usage, one ``DummyVecEnv`` of single-board ``SnakeEnv`` instances,
  with the same board, observation (features + flood-fill fractions), env-step budget and
  hyperparameters read from the rlperf config: network widths, Adam learning rate, gamma, batch,
  buffer capacity, learning starts, the linear ε schedule, Huber loss, gradient clip, and the same
  number of gradient updates per env step (``train_freq`` x ``n_envs`` env steps per update) with a
  soft target update after each (``tau``). SB3's DQN has no Double-DQN target; rlperf's does. Its
  wall time is ``model.learn()``.

Scores are fruits eaten per episode; "time to score S" is the first wall-clock second at which
the mean over the last 100 finished episodes reaches S, found by rlperf's own implementation
(``rlperf.score``) for both: rlperf's record (``time_to_score``, its ``run_wall_s``: from the run's
start, warm-up included, as SB3's is) and, for SB3, the same code fed every episode end through a
callback. ``--sb3-max-s`` caps an SB3 run's wall time; a score it did not reach by then is
reported as "not reached in X s" and the ratio as a lower bound. Both use ``--threads`` torch
threads (default: torch's own, one per core). Wall time is split into the gradient updates
(rlperf's ``train`` phase; SB3's ``DQN.train`` calls, timed by wrapping the method) and everything
else (acting, env, replay, bookkeeping): the two libraries do the same number of updates of the
same network, so the update time is a floor they share.

CleanRL is not run: its PyPI package (``cleanrl`` 0.4.8, 2021) is a set of scripts written for the
pre-Gymnasium ``gym`` API (``env.seed``, 4-tuple ``step``) that parse ``sys.argv`` and open wandb at
import, and current CleanRL is not packaged (single-file scripts meant to be copied); running it
against a Gymnasium 1.x env would mean copying and porting its code.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from benchutil import emit, print_header, figure, machine_info, machine_line, package_version, save_figure, summarize
from rlperf.config import config_from
from rlperf.dqn import Progress, eps_decay_steps
from rlperf.score import WINDOW, target_key, time_to

DEFAULT_TARGETS = (2.0, 5.0, 10.0, 20.0)


# ---------------------------------------------------------------------------------------- rlperf


def run_rlperf(config: str, steps: int | None, threads: int, out: Path, targets: list[float]) -> dict:
    cmd = [sys.executable, "-m", "rlperf", "train", "--config", config, "--out", str(out), "--json", "--quiet",
           "--device", "cpu", "--set", "train.log_every=10", "--set", f"run.threads={threads}",
           "--set", f"train.score_targets=[{','.join(target_key(t) for t in targets)}]"]
    if steps:
        cmd += ["--steps", str(steps)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"rlperf train failed ({' '.join(cmd)}):\n{proc.stderr[-2000:]}")
    record = json.loads(proc.stdout)
    with open(Path(record["run_dir"]) / "metrics.csv", newline="") as f:
        curve = [
            {"env_steps": int(row["env_steps"]), "wall_s": float(row["wall_s"]), "episodes": int(row["episodes"]),
             "mean_score_100": float(row["mean_score_100"])}
            for row in csv.DictReader(f)
        ]
    totals = record["totals"]
    return {"wall_s": totals["wall_s"], "update_s": record["phases"]["train"]["total_s"],
            "env_steps": totals["env_steps"], "updates": totals["updates"],
            "episodes": totals["episodes"], "env_steps_per_s": totals["env_steps"] / totals["wall_s"],
            "final_mean_score_100": record["learning"]["mean_score_last_100"], "curve": curve,
            "time_to_score": {target_key(t): _hit(record, t) for t in targets}}


def _hit(record: dict, target: float) -> dict | None:
    """Where the record says ``target`` was first reached: seconds from the run's start, env steps."""
    reached = time_to(record, target, "run_wall_s")
    if not reached or not reached[0]:
        return None
    return {"wall_s": reached[1], "env_steps": (time_to(record, target, "env_steps") or (True, None))[1]}


# ------------------------------------------------------------------------------------------- SB3


def sb3_settings(cfg, n_envs: int, total_steps: int) -> dict:
    """SB3 DQN keyword arguments that do what the rlperf config does, per env step."""
    updates_per_env_step = cfg.train.train_ratio / cfg.env.num_envs
    vec_steps_per_update = 1.0 / (updates_per_env_step * n_envs)
    if vec_steps_per_update >= 1:
        train_freq, gradient_steps = max(1, round(vec_steps_per_update)), 1
    else:
        train_freq, gradient_steps = 1, max(1, round(1 / vec_steps_per_update))
    if cfg.agent.target_update == "soft":
        # SB3 lerps every target_update_interval // n_envs vector steps: once per train call here.
        tau, target_update_interval = cfg.agent.tau, train_freq * n_envs
    else:
        tau, target_update_interval = 1.0, max(1, round(cfg.agent.target_every / updates_per_env_step))
    return {
        "learning_rate": cfg.agent.lr,
        "buffer_size": cfg.buffer.capacity,
        "learning_starts": cfg.train.learning_starts,
        "batch_size": cfg.buffer.batch_size,
        "tau": tau,
        "gamma": cfg.agent.gamma,
        "train_freq": train_freq,
        "gradient_steps": gradient_steps,
        "target_update_interval": target_update_interval,
        # The decay rlperf used on this run: a fraction of --steps, or eps_decay_steps of an episode-stopped run.
        "exploration_fraction": min(1.0, eps_decay_steps(cfg) / total_steps),
        "exploration_initial_eps": cfg.agent.eps_start,
        "exploration_final_eps": cfg.agent.eps_end,
        "max_grad_norm": cfg.agent.grad_clip or float("inf"),
        "policy_kwargs": {"net_arch": list(cfg.agent.hidden)},
    }


def run_sb3(cfg, n_envs: int, total_steps: int, flood_fill: str, seed: int, targets: list[float],
            max_s: float) -> dict:
    import gymnasium
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env

    if not cfg.agent.huber:
        raise SystemExit("SB3's DQN uses the Huber loss; compare with agent.huber = true")
    env_kwargs = {"size": cfg.env.size, "obs": cfg.env.obs, "flood_fill": flood_fill,
                  "hunger": cfg.env.hunger or None}
    envs = make_vec_env(lambda: gymnasium.make("rlperf/Snake-v0", **env_kwargs), n_envs=n_envs, seed=seed)
    settings = sb3_settings(cfg, n_envs, total_steps)
    model = DQN("MlpPolicy", envs, device="cpu", seed=seed, verbose=0, **settings)

    class Scores(BaseCallback):
        """Every finished episode's score into rlperf's own time-to-score tracker (``Progress``), and
        the learning curve; stops the run after ``max_s`` seconds."""

        def __init__(self) -> None:
            super().__init__()
            self.scores: list[float] = []
            self.curve: list[dict] = []
            self.progress = Progress(score_targets=tuple(targets))
            self.capped = False

        def _on_training_start(self) -> None:
            self.started = time.perf_counter()

        def clock(self) -> dict:
            wall = time.perf_counter() - self.started
            return {"wall_s": wall, "run_wall_s": wall, "env_steps": self.num_timesteps, "updates": model._n_updates}

        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done:
                    score = float(info["score"])
                    self.scores.append(score)
                    self.progress.add_episodes(np.array([score]), np.array([0]), np.array([0.0]), clock=self.clock)
                    window = self.scores[-WINDOW:]
                    self.curve.append({"env_steps": self.num_timesteps, "wall_s": time.perf_counter() - self.started,
                                       "episodes": len(self.scores), "mean_score_100": sum(window) / len(window)})
            if max_s and time.perf_counter() - self.started > max_s:
                self.capped = True
                return False
            return True

    # Time SB3's gradient updates (DQN.train, called every train_freq steps) apart from the rest.
    update_s = [0.0]
    train = model.train

    def timed_train(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return train(*args, **kwargs)
        finally:
            update_s[0] += time.perf_counter() - t0

    model.train = timed_train
    scores = Scores()
    started = time.perf_counter()
    model.learn(total_timesteps=total_steps, callback=scores)
    wall = time.perf_counter() - started
    envs.close()
    window = scores.scores[-WINDOW:]
    # Thin the per-episode curve for the results file (the crossings were found at every episode end).
    step = max(1, len(scores.curve) // 400)
    return {"wall_s": wall, "update_s": update_s[0], "env_steps": model.num_timesteps, "updates": model._n_updates,
            "episodes": len(scores.scores), "env_steps_per_s": model.num_timesteps / wall,
            "final_mean_score_100": sum(window) / len(window) if window else 0.0,
            "curve": scores.curve[::step] + scores.curve[-1:], "capped_at_s": max_s if scores.capped else None,
            "time_to_score": {target_key(t): scores.progress.time_to_score.get(target_key(t)) for t in targets},
            "settings": {k: v for k, v in settings.items() if k != "policy_kwargs"}
            | {"net_arch": settings["policy_kwargs"]["net_arch"]}}


# ------------------------------------------------------------------------------------------ main


def summarize_runs(runs: list[dict], targets: list[float]) -> dict:
    for r in runs:
        r["other_s"] = r["wall_s"] - r["update_s"]
    out = {
        key: summarize(r[key] for r in runs)
        for key in ("wall_s", "update_s", "other_s", "env_steps_per_s", "final_mean_score_100")
    }
    out["env_steps"] = runs[0]["env_steps"]
    out["updates"] = runs[0]["updates"]
    out["episodes"] = summarize(r["episodes"] for r in runs)
    out["time_to_score"] = {}
    capped = [r["capped_at_s"] for r in runs if r.get("capped_at_s")]
    out["capped_at_s"] = max(capped) if capped else None
    for t in targets:
        hits = [r["time_to_score"][target_key(t)] for r in runs]
        reached = [h for h in hits if h]
        out["time_to_score"][str(t)] = {
            "reached": len(reached),
            "runs": len(runs),
            "wall_s": summarize(h["wall_s"] for h in reached) if reached else None,
            "env_steps": summarize(h["env_steps"] for h in reached) if reached else None,
        }
    out["curve"] = runs[len(runs) // 2]["curve"]  # one run's curve (the middle repeat) for the plot
    return out


def plot(results: dict, path: Path) -> None:
    plt, fig, ax = figure(figsize=(7.5, 4.5))
    for entry in results["entries"]:
        curve = entry["summary"]["curve"]
        ax.plot([p["wall_s"] for p in curve], [p["mean_score_100"] for p in curve], label=entry["label"])
    ax.set_xscale("log")
    ax.set_xlabel("wall-clock seconds (log)")
    ax.set_ylabel(f"mean score, last {WINDOW} episodes")
    m = results["machine"]
    capped = [e["summary"].get("capped_at_s") for e in results["entries"] if e["summary"].get("capped_at_s")]
    budget = f"{results['env_steps']:,} env steps each" + (f" (SB3 stopped at {max(capped):.0f} s)" if capped else "")
    ax.set_title(f"Snake {results['board']}x{results['board']}, {budget}\n{machine_line(m)}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(plt, fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="default", help="rlperf config (name or path); SB3 copies its settings")
    parser.add_argument("--steps", type=int, default=0, help="env steps for every run (default: rlperf's own run)")
    parser.add_argument("--sb3-envs", default="1,16", help="comma-separated n_envs for SB3 runs")
    parser.add_argument(
        "--sb3-flood-fill",
        default="bfs",
        choices=("bfs", "tensor"),
        help="flood fill in SB3's single-board envs (same observation; bfs is faster per board)",
    )
    parser.add_argument("--targets", default=",".join(str(t) for t in DEFAULT_TARGETS), help="mean scores to time")
    parser.add_argument("--repeats", type=int, default=3, help="rlperf runs (seconds each)")
    parser.add_argument("--sb3-repeats", type=int, default=1, help="runs per SB3 setting (minutes each)")
    parser.add_argument("--sb3-max-s", type=float, default=0.0,
                        help="stop an SB3 run after this many seconds (0: run its whole env-step budget)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads for both (0: torch's default, one per core)")
    parser.add_argument("--out", type=Path, help="also write the JSON results here")
    parser.add_argument("--plot", type=Path, help="write learning curves (score vs wall time) as PNG here")
    parser.add_argument("--quick", action="store_true", help="tiny runs, for the test suite")
    parser.add_argument("--json", action="store_true", help="print results as one JSON document")
    args = parser.parse_args()
    if package_version("stable-baselines3") is None:
        raise SystemExit('bench_peers needs Stable-Baselines3: pip install -e ".[bench]"')
    config = args.config
    targets = [float(t) for t in args.targets.split(",")]
    sb3_envs = [int(k) for k in args.sb3_envs.split(",")]
    if args.quick:
        config, args.steps, args.repeats, args.sb3_repeats, sb3_envs = "smoke", 0, 1, 1, [1, 4]
    if args.threads:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    cfg = config_from(config, steps=args.steps or None)
    seed = cfg.run.seed

    results: dict = {
        "machine": machine_info(torch.device("cpu")),
        "config": config,
        "board": cfg.env.size,
        "obs": cfg.env.obs,
        "flood_fill": cfg.env.flood_fill,
        "targets": targets,
        "entries": [],
        "cleanrl": "not run: see the script's docstring",
    }
    with tempfile.TemporaryDirectory() as tmp:
        print(f"rlperf train --config {config}:", file=sys.stderr, flush=True)
        runs = [run_rlperf(config, args.steps or None, threads, Path(tmp), targets) for _ in range(args.repeats)]
        steps = args.steps or runs[0]["env_steps"]
        results["env_steps"] = steps
        results["entries"].append(
            {
                "label": f"rlperf train ({cfg.env.num_envs} boards, batched)",
                "kind": "rlperf",
                "n_envs": cfg.env.num_envs,
                "summary": summarize_runs(runs, targets),
            }
        )
        print(f"  {runs[0]['env_steps']:,} env steps, {statistics.median(r['wall_s'] for r in runs):.1f} s", file=sys.stderr)
    for n_envs in sb3_envs:
        print(f"SB3 DQN, make_vec_env n_envs={n_envs}, {steps:,} env steps:", file=sys.stderr, flush=True)
        runs = [run_sb3(cfg, n_envs, steps, args.sb3_flood_fill, seed, targets, args.sb3_max_s)
                for _ in range(args.sb3_repeats)]
        summary = summarize_runs(runs, targets)
        results["entries"].append(
            {
                "label": f"SB3 DQN (DummyVecEnv, n_envs={n_envs})",
                "kind": "sb3",
                "n_envs": n_envs,
                "settings": runs[0]["settings"],
                "summary": summary,
            }
        )
        print(
            f"  {summary['wall_s']['median']:.1f} s, {summary['env_steps_per_s']['median']:,.0f} env steps/s, "
            f"final score {summary['final_mean_score_100']['median']:.2f}",
            file=sys.stderr,
            flush=True,
        )

    ours = results["entries"][0]["summary"]
    for entry in results["entries"]:
        s = entry["summary"]
        entry["rlperf_speedup"] = {
            "wall": s["wall_s"]["median"] / ours["wall_s"]["median"],
            "update_s": s["update_s"]["median"] / ours["update_s"]["median"],
            "other_s": s["other_s"]["median"] / ours["other_s"]["median"],
            "env_steps_per_s": ours["env_steps_per_s"]["median"] / s["env_steps_per_s"]["median"],
            "time_to_score": {},
        }
        for t, hit in s["time_to_score"].items():
            mine = ours["time_to_score"][t]
            if not mine["wall_s"]:
                continue
            if hit["wall_s"]:
                entry["rlperf_speedup"]["time_to_score"][t] = {
                    "ratio": hit["wall_s"]["median"] / mine["wall_s"]["median"],
                    "bound": "exact",
                }
            else:  # never reached within the budget: the ratio is at least its whole run over rlperf's crossing
                entry["rlperf_speedup"]["time_to_score"][t] = {
                    "ratio": s["wall_s"]["median"] / mine["wall_s"]["median"],
                    "bound": "at least",
                }
    if args.plot:
        plot(results, args.plot)
    if emit(results, args.out, args.json):
        return

    m = results["machine"]
    print(
        f"\nSnake {cfg.env.size}x{cfg.env.size}, obs {cfg.env.obs} + flood fill, {steps:,} env steps per run | "
        f"{machine_line(m, threads)}"
    )
    header = (
        f"{'':38} {'wall s':>8} {'updates s':>9} {'other s':>8} {'env steps/s':>12} {'updates':>8} {'score':>6}"
        + "".join(f" {'t→' + format(t, 'g'):>12}" for t in targets)
    )
    print_header(header)
    for entry in results["entries"]:
        s = entry["summary"]
        cells = []
        for t in targets:
            hit = s["time_to_score"][str(t)]
            missing = f"not reached in {s['wall_s']['median']:.0f} s" if s.get("capped_at_s") else "not reached"
            cells.append(f"{hit['wall_s']['median']:>11.1f}s" if hit["wall_s"] else f"{missing:>12}")
        print(
            f"{entry['label']:38} {s['wall_s']['median']:>8.1f} {s['update_s']['median']:>9.1f} "
            f"{s['other_s']['median']:>8.1f} "
            f"{s['env_steps_per_s']['median']:>12,.0f} "
            f"{s['updates']:>8,} {s['final_mean_score_100']['median']:>6.2f}" + "".join(f" {c}" for c in cells)
        )
    for entry in results["entries"][1:]:
        sp = entry["rlperf_speedup"]
        parts = [
            f"{'≥' if v['bound'] == 'at least' else ''}{v['ratio']:.1f}× to score {float(t):g}"
            for t, v in sp["time_to_score"].items()
        ]
        print(
            f"rlperf vs {entry['label']}: {sp['wall']:.1f}× wall ({sp['update_s']:.1f}× in updates, "
            f"{sp['other_s']:.0f}× in the rest), "
            f"{sp['env_steps_per_s']:.1f}× env steps/s; " + ", ".join(parts)
        )


if __name__ == "__main__":
    main()
