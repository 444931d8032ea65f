"""The dashboard reads the phase shares only when it redraws (never on every log)."""

from __future__ import annotations

from rlperf.report.dashboard import Dashboard

SNAPSHOT = {"episodes": 3, "env_steps_per_s": 100.0, "updates_per_s": 2.0, "mean_score": 1.5, "epsilon": 0.5, "loss": 0.1}


def test_shares_and_extra_are_read_only_when_the_dashboard_redraws(capsys) -> None:
    calls = []

    def shares() -> dict[str, float]:
        calls.append("shares")
        return {"select": 0.25, "train": 0.75}

    board = Dashboard(100, "episodes", enabled=True, plain_every_s=3600)
    for _ in range(50):
        board.update(3, SNAPSHOT, shares, extra=lambda: calls.append("extra") or "async: x")
    assert calls == ["shares", "extra"]  # the first update draws, the next 49 are throttled
    err = capsys.readouterr().err
    assert "train 75%" in err and "async: x" in err and err.count("episodes 3") == 1


def test_disabled_dashboard_reads_nothing() -> None:
    board = Dashboard(100, "episodes", enabled=False)
    board.update(1, SNAPSHOT, lambda: 1 / 0, extra=lambda: 1 / 0)  # would raise if called


def test_first_update_draws_even_just_after_boot(monkeypatch, capsys) -> None:
    """time.monotonic() counts from boot: a throttle measured against 0 would swallow the first draw."""
    monkeypatch.setattr("rlperf.report.dashboard.time.monotonic", lambda: 5.0)
    board = Dashboard(100, "episodes", enabled=True, plain_every_s=3600)
    board.update(3, SNAPSHOT)
    assert capsys.readouterr().err.count("episodes 3") == 1


def test_a_run_shows_which_env_kernel_and_update_form_it_took(tmp_path, capsys) -> None:
    """The dashboard's first line says what the record's env and update sections say, and why."""
    import json

    from conftest import run_cli

    code, _, err = run_cli(["train", "--config", "smoke", "--steps", "1500", "--set", "train.update=torch", "--out",
                            str(tmp_path)], capsys)
    assert code == 0, err
    record = json.loads(next(tmp_path.glob("*/run.json")).read_text())
    heading = err.splitlines()[0]
    assert heading == (f"env kernel {record['env']['kernel']}: {record['env']['reason']}  ·  "
                       f"update torch: {record['update']['reason']}")
    assert err.count("update torch:") == 1  # once, not on every plain line
