"""Report renderers: the numbers they are given, in loop order, as plain text."""

from __future__ import annotations

import pytest
import torch

from rlperf.report.tables import phase_table, render_to_str, summary_table
from rlperf.timers import PHASES, PhaseTimer


def _phase(total_s: float, share: float, calls: int, mean: float, p50: float, p95: float) -> dict:
    return {"total_s": total_s, "share": share, "calls": calls, "mean_ms": mean, "p50_ms": p50, "p95_ms": p95}


PHASE_DATA = {
    # Deliberately out of order: the table puts them in loop order.
    "train": _phase(4.5, 0.45, 250, 18.0, 17.5, 25.25),
    "log": _phase(0.5, 0.05, 1000, 0.5, 0.25, 1.5),
    "select": _phase(1.0, 0.10, 1000, 1.0, 0.95, 1.75),
    "step": _phase(3.0, 0.30, 1000, 3.0, 2.875, 4.5),
    "push": _phase(1.0, 0.10, 1000, 1.0, 0.9, 1.25),
}

RECORD = {
    "schema": 1,
    "status": "completed",
    "totals": {"episodes": 5000, "env_steps": 1_234_567, "updates": 4821, "wall_s": 83.4, "warmup_s": 1.25},
    "throughput": {"env_steps_per_s": 14_803.0, "updates_per_s": 57.8, "episodes_per_s": 60.0, "replay_ratio": 0.5},
    "phases": PHASE_DATA,
    "learning": {"mean_score_last_100": 12.345, "best_score": 31, "mean_return_last_100": 11.0},
    "memory": {"peak_rss_mb": 812.4, "peak_cuda_mb": None},
}


def _row(text: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│┃").split("│")]
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")


def test_phase_table_numbers_and_order() -> None:
    text = render_to_str(phase_table(PHASE_DATA, title="phases", timing_mode="events"))
    assert "phases" in text and "timing: events" in text
    header = _row(text.replace("┃", "│"), "phase")
    assert header == ["phase", "total s", "share", "calls", "mean ms", "p50 ms", "p95 ms"]
    order = [line.split()[1] for line in text.splitlines() if line.split()[1:2] and line.split()[1] in PHASES]
    assert order == list(PHASES)
    assert _row(text, "train") == ["train", "4.500", "45.0%", "250", "18.0", "17.5", "25.2"]
    assert _row(text, "step") == ["step", "3.000", "30.0%", "1,000", "3.00", "2.88", "4.50"]
    assert _row(text, "log") == ["log", "0.500", "5.0%", "1,000", "0.500", "0.250", "1.50"]
    assert _row(text, "total")[:4] == ["total", "10.000", "100.0%", "4,250"]


def test_phase_table_from_a_live_timer() -> None:
    timer = PhaseTimer(torch.device("cpu"))
    with timer.phase("push"):
        pass
    timer.step_done()
    text = render_to_str(phase_table(timer.to_dict()["phases"], timing_mode=timer.mode))
    assert _row(text, "push")[2:4] == ["100.0%", "1"]
    assert _row(text, "train")[3:] == ["0", "–", "–", "–"]  # never entered
    assert "timing: cpu" in text


def test_summary_table_values() -> None:
    text = render_to_str(summary_table(RECORD))
    expected = {
        "status": "completed",
        "episodes": "5,000",
        "env steps": "1,234,567",
        "updates": "4,821",
        "wall time": "1m 23.4s",
        "env steps/s": "14.8 k",
        "updates/s": "57.8",
        "replay ratio": "0.5",
        "mean score (last 100)": "12.35",
        "best score": "31",
        "peak RSS": "812.4 MiB",
        "peak CUDA memory": "–",
    }
    for label, value in expected.items():
        assert _row(text, label) == [label, value]
    assert "rates exclude 1.2 s of warm-up" in text


def test_summary_table_tolerates_missing_sections() -> None:
    text = render_to_str(summary_table({"schema": 1}))
    assert _row(text, "episodes") == ["episodes", "–"]
    assert "status" not in text


def test_render_to_str_is_plain_text() -> None:
    text = render_to_str(phase_table(PHASE_DATA), width=80)
    assert "\x1b[" not in text
    assert max(len(line) for line in text.splitlines()) <= 80


def _intervals(lengths: list[float], us_per_step: list[float], steps: int = 2560) -> list[dict]:
    """A record's intervals for a run whose episodes have these lengths and cost per env step."""
    rows, wall, total = [], 0.0, 0
    for length, us in zip(lengths, us_per_step, strict=True):
        total += steps
        wall += steps * us * 1e-6
        rows.append({"env_steps": total, "wall_s": wall, "episodes": round(steps / length),
                     "mean_episode_length": length, "s_per_1000_env_steps": us * 1e-3})
    return rows


def test_time_per_episode_splits_into_its_two_factors() -> None:
    from rlperf.report.stats import episode_split
    from rlperf.report.tables import episode_growth_line

    # Episodes 5x longer, cost per env step flat: the seed's "14x slower than linear" that is not a slowdown.
    longer = _intervals([14, 14, 14, 14, 30, 50, 70, 70, 70, 70], [37] * 10)
    split = episode_split(longer)
    assert split is not None
    assert split["growth"]["steps_per_episode"] == pytest.approx(5.0, rel=0.02)
    assert split["growth"]["s_per_env_step"] == pytest.approx(1.0)
    assert split["growth"]["s_per_episode"] == pytest.approx(5.0, rel=0.02)
    line = episode_growth_line({"intervals": longer})
    assert line is not None and "episodes got longer" in line and "§19" in line and "×1.00" in line
    # Same episode length, each env step 3x dearer: a real slowdown, said so.
    slower = _intervals([20] * 10, [30, 30, 30, 40, 50, 60, 70, 80, 90, 90])
    line = episode_growth_line({"intervals": slower})
    assert line is not None and "each env step got slower" in line and "steps per episode ×1.00" in line
    # Flat run, or too few intervals: nothing to say.
    assert episode_growth_line({"intervals": _intervals([20] * 10, [30] * 10)}) is None
    assert episode_split(longer[:5]) is None


def test_seconds_short_never_prints_zero_for_a_measured_time() -> None:
    from rlperf.report.units import seconds_short

    assert seconds_short(0.0025) == "2.5 ms" and seconds_short(0.0) == "0.00 s"
    assert seconds_short(3.14159) == "3.14 s" and seconds_short(314.2) == "314 s"


def test_off_a_terminal_a_wide_table_keeps_each_name_on_one_line(capsys: pytest.CaptureFixture[str],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Piped (CI logs, | less, > file): rich would fit the table to 80 columns and split long names."""
    from rich.table import Table

    from rlperf.report.tables import print_table, stdout_console

    monkeypatch.delenv("COLUMNS", raising=False)
    names = ["rlperf/fused_update.py:450(_update_fused)",
             "x" * 30 + "/site-packages/torch/nn/modules/module.py:1750(_call_impl)"]
    table = Table(title="cProfile")
    for column in ("function", "ncalls", "tottime", "cumtime", "percall", "filename:lineno(function) again"):
        table.add_column(column)
    for name in names:
        table.add_row(name, "1,000", "0.123", "4.567", "0.001", name)
    print_table(table)
    console = stdout_console()  # the console train and profile print their tables on
    console.print(phase_table(PHASE_DATA, title="phases"))
    console.print(table)
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) > 80
    for name in names:
        assert sum(line.count(name) for line in out.splitlines()) == 4  # whole, in both tables, twice
    assert _row(out, "train")[:2] == ["train", "4.500"]
