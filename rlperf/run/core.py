"""What every run has, whichever loop it runs: :class:`RunCore`.

A sync run (:class:`rlperf.run.lifecycle.SyncRun`, the in-process loop) and an async run
(:class:`rlperf.run.learner.Learner`, actor supervision and the learner loop) differ only in their
loops. Both hold one :class:`RunCore` for the rest: the run directory and its config, the files
(``config.toml``, ``metrics.csv``, the space held back for the record), the checkpoint writer, the
dashboard and TensorBoard, the stop signal, the record's writing and the exit code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from rlperf.atomic import write_json_atomic, write_text_atomic
from rlperf.config import Config, to_toml
from rlperf.errors import DiskError
from rlperf.report.dashboard import Dashboard
from rlperf.run.checkpoint import CheckpointWriter, tidy_for_resume
from rlperf.run.common import RunResult
from rlperf.run.files import (
    CHECKPOINT_NAME, CONFIG_NAME, RECORD_NAME, SpaceReserve, discard_run_dir, forget_run_dir,
)
from rlperf.run.record import MetricsLog, RunHistory, Window, metrics_row, reset_peak_memory
from rlperf.run.signals import StopSignal, exit_code

if TYPE_CHECKING:
    from rlperf.dqn import Progress
    from rlperf.env.plan import EnvPlan

@dataclass(kw_only=True)
class RunCore:
    """One run's directory, files, checkpoints, dashboard, stop signal and record.

    Build it with :meth:`open` once the run directory exists and everything was accepted.
    ``new_dir``: this run created the directory (a resume continues one); ``resumed_at``: the env
    step a resume started from; ``resumable``: ``rlperf train --resume`` can continue the run.
    """

    cfg: Config
    device: torch.device
    run_dir: Path
    kind: str
    history: RunHistory
    stop: StopSignal
    new_dir: bool
    resumed_at: int | None
    resumable: bool
    rss_scope: str
    reserve: SpaceReserve
    metrics: MetricsLog  # metrics.csv, and TensorBoard scalars with train.tensorboard
    checkpoints: CheckpointWriter
    board: Dashboard
    disk: DiskError | None = None  # the disk error that ended the run, raised once its record is written

    @classmethod
    def open(cls, *, cfg: Config, device: torch.device, run_dir: Path, kind: str, history: RunHistory,
             stop: StopSignal, new_dir: bool, show: bool, resumed: Progress | None = None,
             finished_row: bool = False, resumable: bool = True, heading: str | None = None) -> RunCore:
        """Reset the memory peaks, hold the record's space back, write ``config.toml`` and open
        ``metrics.csv`` (a resume first tidies what a killed run left after its checkpoint). A disk
        error here, before the first step, leaves nothing of a new run. ``finished_row``: the resumed run's
        last row is its finish row, which goes (:func:`rlperf.run.checkpoint.finish_row`). ``heading``:
        the dashboard's first line (:func:`forms_line`)."""
        rss_scope = reset_peak_memory(device)
        reserve: SpaceReserve | None = None
        try:
            if resumed is not None:  # first: it removes temp files, and the reserve is named like one
                tidy_for_resume(run_dir, resumed.vector_steps, finished_row)
            reserve = SpaceReserve(run_dir)
            write_text_atomic(run_dir / CONFIG_NAME, to_toml(cfg))
            metrics = MetricsLog(run_dir, tensorboard=cfg.train.tensorboard)
        except DiskError:
            if reserve is not None:
                reserve.release()
            if new_dir:
                discard_run_dir(run_dir)
            raise
        t = cfg.train
        total, unit = (t.episodes, "episodes") if t.episodes > 0 else (t.steps, "env steps")
        return cls(cfg=cfg, device=device, run_dir=run_dir, kind=kind, history=history, stop=stop, new_dir=new_dir,
                   resumed_at=resumed.env_steps if resumed is not None else None, resumable=resumable,
                   rss_scope=rss_scope, reserve=reserve, metrics=metrics,
                   checkpoints=CheckpointWriter(run_dir / CHECKPOINT_NAME, resumed),
                   board=Dashboard(total, unit, enabled=show, heading=heading))

    def log(self, p: Progress, wall: float, window: Window | None, phase_totals: dict[str, float],
            shares: Callable[[], dict[str, float]] | None = None, extra: Callable[[], str] | None = None) -> dict[str, Any]:
        """One log interval: a metrics.csv row (and TensorBoard scalars) with the interval's phase
        seconds (from ``phase_totals``, each phase's seconds since the run started), and the dashboard's line."""
        row = metrics_row(p, wall, window, self.history, phase_totals)
        self.metrics.write(row, p.take_episodes())
        board = self.board
        if board.enabled:
            done = p.episodes if board.unit == "episodes" else p.env_steps
            board.update(done, {"episodes": p.episodes, "env_steps_per_s": row["env_steps_per_s"],
                                "updates_per_s": window.rate(window.updates) if window is not None else 0.0,
                                "mean_score": p.mean_score, "epsilon": p.epsilon, "loss": p.last_loss},
                         shares, extra=extra)
        return row

    def close_files(self) -> None:
        """metrics.csv and TensorBoard, once the loop is over."""
        self.metrics.close()

    def final_checkpoint(self, status: str, error: str | None, state: Callable[[], dict[str, Any]],
                         p: Progress) -> tuple[str, str | None]:
        """Write the end-of-run checkpoint and return the run's (status, error). Only a run that
        stopped at a clean step boundary is checkpointed: a diverged run's weights are not saved over
        the last good checkpoint, and a failed step may be half done."""
        if not self.cfg.train.checkpoint or status not in ("completed", "interrupted"):
            return status, error
        try:
            self.checkpoints.write(state(), p)
        except DiskError as exc:
            self.disk = self.disk or exc
            return "failed", str(exc)
        return status, error

    def write_record(self, record: dict[str, Any], env_steps: int) -> None:
        """Write ``run.json`` with the space held back for it; a disk error (the run's, or the record's
        own) is raised after it, as one line saying what the run directory holds."""
        self.reserve.release()
        kept = self.checkpoints.env_steps
        checkpoint = f"checkpoint.pt is from env step {kept}" if kept is not None else "there is no checkpoint"
        try:
            write_json_atomic(self.run_dir / RECORD_NAME, record)
        except DiskError as exc:
            if not self.new_dir and kept == self.resumed_at:  # no checkpoint of its own: as it was before
                self.metrics.rollback()
            if kept is None and self.new_dir:
                discard_run_dir(self.run_dir)
                left = f"the run stopped at env step {env_steps} and nothing of it was kept"
            else:
                left = f"the run stopped at env step {env_steps} and its record could not be written: {checkpoint}"
                if self.resumable:
                    left += f", continue it with rlperf train --resume {self.run_dir}"
            raise with_detail(self.disk or exc, left) from None
        forget_run_dir(self.run_dir)
        if self.disk is not None:
            raise with_detail(self.disk, f"the run stopped at env step {env_steps}: run.json says failed, {checkpoint}",
                              record=record, run_dir=self.run_dir) from None

    def result(self, record: dict[str, Any]) -> RunResult:
        """The run's result: its directory, its record and the exit code its status and signal give."""
        return RunResult(self.run_dir, record, exit_code(record["status"], self.stop.signum))


def forms_line(env: EnvPlan, update: tuple[str, str]) -> str:
    """The dashboard's heading: which env kernel and update form this run took, and why (as the record's
    ``env`` and ``update`` sections and the summary say)."""
    return f"env kernel {env.kernel or env.backend}: {env.reason}  ·  update {update[0]}: {update[1]}"


def with_detail(exc: DiskError, detail: str, record: dict[str, Any] | None = None,
                run_dir: Path | None = None) -> DiskError:
    """``exc`` with what the run directory holds now, still one line; the record and run directory
    ride along for callers that keep going (a sweep)."""
    out = DiskError(f"{exc.message}; {detail}", hint=exc.hint)
    out.record, out.run_dir = record, run_dir  # type: ignore[attr-defined]
    return out
