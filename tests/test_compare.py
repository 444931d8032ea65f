"""``rlperf compare``: the comparison data, its table (ratios, noise, units, digits), warnings,
and the command on run directories, run.json files, configs and ``--vs``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import run_cli
from rlperf.experiments.compare import Side, compare, compare_table
from rlperf.report.units import format_number, pick_unit
from rlperf.run.files import read_record
from rlperf.report.tables import render_to_str

TINY_TOML = """
[run]
device = "cpu"
threads = 1
[env]
num_envs = 8
size = 6
[agent]
hidden = [16]
eps_decay_steps = 500
[buffer]
capacity = 2000
batch_size = 16
[train]
steps = 256
learning_starts = 64
train_ratio = {ratio}
log_every = 8
warmup_steps = 2
checkpoint = false
"""

SYSTEM = {"rlperf": "0.1.0", "torch": "2.13.0", "device": "cpu", "device_name": "AMD EPYC", "torch_threads": 2}


def record(env_rate: float = 1000.0, s_per_1000: float = 10.0, score: float = 1.0, train_s: float = 2.0,
           rss: float = 500.0, rss_scope: str = "run", **system: object) -> dict:
    """A synthetic run record with the sections compare reads."""
    return {
        "schema": 1,
        "kind": "train",
        "status": "completed",
        "name": "synthetic",
        "system": {**SYSTEM, **system},
        "phases": {
            "select": {"total_s": 1.0, "share": 1 / (1 + train_s)},
            "train": {"total_s": train_s, "share": train_s / (1 + train_s)},
        },
        "throughput": {"env_steps_per_s": env_rate, "updates_per_s": env_rate / 10, "s_per_1000_episodes": s_per_1000},
        "learning": {"mean_score_last_100": score},
        "memory": {"peak_rss_mb": rss, "rss_scope": rss_scope, "peak_cuda_mb": None},
    }


def row(comparison: dict, metric: str) -> dict:
    return next(r for r in comparison["rows"] if r["metric"] == metric)


def text_row(text: str, first: str) -> list[str]:
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{text}")



# -- the comparison as data and as a table -------------------------------------------------------


def test_ratio_column_against_the_first_run() -> None:
    a = Side("naive", "a", [record(env_rate=1000, s_per_1000=10.0, score=1.0, train_s=4.0, rss=500)])
    b = Side("fast", "b", [record(env_rate=12_500, s_per_1000=0.8, score=1.5, train_s=0.5, rss=400)])
    c = compare([a, b])
    assert [r["metric"] for r in c["rows"]] == [
        "phase.select",
        "phase.train",
        "env_steps_per_s",
        "updates_per_s",
        "s_per_1000_env_steps",
        "s_per_1000_episodes",
        "mean_score",
        "peak_rss_mb",
    ]  # no CUDA row without data; seconds per 1000 env steps derived from a record that predates them
    assert row(c, "env_steps_per_s")["ratios"][0] == {
        "vs": "fast",
        "kind": "speedup",
        "value": 12.5,
        "spread": None,
        "inside_noise": None,
    }
    assert row(c, "s_per_1000_episodes")["ratios"][0]["value"] == pytest.approx(12.5)  # lower is better: a speed-up too
    assert row(c, "s_per_1000_env_steps")["cells"][0]["median"] == pytest.approx(1.0)
    assert row(c, "s_per_1000_env_steps")["ratios"][0]["value"] == pytest.approx(12.5)
    assert row(c, "phase.train")["ratios"][0]["value"] == 8.0
    assert row(c, "mean_score")["ratios"][0]["value"] == 0.5  # a difference
    assert row(c, "peak_rss_mb")["ratios"][0]["value"] == pytest.approx(-0.2)  # a change
    assert row(c, "env_steps_per_s")["best"] == 1 and row(c, "peak_rss_mb")["best"] == 1
    assert row(c, "phase.select")["best"] is None  # equal: nothing to highlight
    assert c["warnings"] == []

    text = render_to_str(compare_table(c), width=120)
    assert text_row(text, "env steps/s") == ["env steps/s", "k/s", "1.00", "12.5", "12.5×"]
    assert text_row(text, "train") == ["train", "ms", "4,000 (80%)", "500 (33%)", "8.00×"]  # unit from the smallest
    assert text_row(text, "s / 1000 episodes") == ["s / 1000 episodes", "s", "10.0", "0.800", "12.5×"]
    assert text_row(text, "mean score (last 100)")[-1] == "+0.500"
    assert text_row(text, "peak RSS")[-1] == "-20%"
    assert "fast vs naive" in text and "× = speed-up over naive" in text


def test_a_process_wide_rss_peak_is_shown_but_never_compared() -> None:
    # Where the peak could not be reset per run, runs in one process share one peak: no ratio, no best.
    a = Side("big", "a", [record(rss=3197.0, rss_scope="process")])
    b = Side("small", "b", [record(rss=3197.0, rss_scope="run")])
    c = compare([a, b])
    rss = row(c, "peak_rss_mb")
    assert rss["label"] == "peak RSS (process so far)" and rss["ratios"] == [None] and rss["best"] is None
    text = render_to_str(compare_table(c), width=120)
    assert text_row(text, "peak RSS (process so far)")[-1] == "–"


def test_noise_marking_overlapping_vs_separate_spreads() -> None:
    base = [record(env_rate=r, s_per_1000=s) for r, s in ((1000, 10.0), (1100, 10.5), (1200, 11.0))]
    other = [record(env_rate=r, s_per_1000=s) for r, s in ((1150, 5.0), (1250, 5.1), (1300, 5.2))]
    c = compare([Side("a", "a", base), Side("b", "b", other)])
    rate, time = row(c, "env_steps_per_s"), row(c, "s_per_1000_episodes")
    assert rate["ratios"][0]["inside_noise"] is True  # [1000, 1200] and [1150, 1300] overlap
    assert time["ratios"][0]["inside_noise"] is False  # [10, 11] and [5, 5.2] do not
    assert rate["cells"][0] == {"median": 1100, "spread": 100, "min": 1000, "max": 1200, "n": 3, "samples": [1000, 1100, 1200]}
    text = render_to_str(compare_table(c), width=140)
    assert text_row(text, "env steps/s")[-1] == "1.1× (noise)"  # 1.136, trimmed to its ±0.17
    assert text_row(text, "env steps/s")[2:4] == ["1.1 ± 0.1", "1.25 ± 0.07"]  # digits trimmed to the spread
    assert "(noise)" not in text_row(text, "s / 1000 episodes")[-1]
    assert "median ± half the min–max range over 3 runs" in " ".join(text.split())
    assert "(noise) = the two ranges overlap" in " ".join(text.split())

    # Below three samples a side, a range says too little: no verdict either way.
    two = compare([Side("a", "a", base[:2]), Side("b", "b", other[:2])])
    assert row(two, "env_steps_per_s")["ratios"][0]["inside_noise"] is None


def test_records_from_different_devices_and_versions_warn(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = record()
    b = record(env_rate=90_000, device="cuda", device_name="NVIDIA H100", rlperf="0.2.0", torch_threads=8)
    c = compare([Side("cpu-run", "a", [a]), Side("gpu-run", "b", [b])])
    joined = "\n".join(c["warnings"])
    assert "records differ in device: cpu (AMD EPYC) in cpu-run; cuda (NVIDIA H100) in gpu-run" in joined
    assert "records differ in rlperf version: 0.1.0 in cpu-run; 0.2.0 in gpu-run" in joined
    assert "records differ in thread count: 2 in cpu-run; 8 in gpu-run" in joined
    assert row(c, "env_steps_per_s")["ratios"][0]["value"] == 90.0  # shown anyway

    # The command prints the table and names the difference on stderr.
    for name, rec in (("cpu-run", a), ("gpu-run", b)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({**rec, "name": name}))
    code, out, err = run_cli(["compare", str(tmp_path / "cpu-run"), str(tmp_path / "gpu-run" / "run.json")], capsys)
    assert code == 0
    assert "gpu-run vs cpu-run" in out
    assert "warning: records differ in device: cpu (AMD EPYC) in cpu-run; cuda (NVIDIA H100) in gpu-run" in err


def test_number_formatting_units_and_digits() -> None:
    assert format_number(12345, 234) == "12,300 ± 200"
    assert format_number(12.3456, 0.0234) == "12.35 ± 0.02"
    assert format_number(12.3456, 0.096) == "12.3 ± 0.1"
    assert format_number(2.92, 14.0) == "3 ± 14"  # the value keeps its first digit however wide the noise
    assert format_number(0.012345) == "0.0123"
    assert format_number(123456) == "123,000"
    assert format_number(0.5, signed=True) == "+0.500"
    assert pick_unit("rate", [2.5e6, 9e5]) == (1e3, "k/s")
    assert pick_unit("seconds", [0.004, 2.0]) == (1e-3, "ms")
    assert pick_unit("seconds", [0.0009, 0.042]) == (1e-3, "ms")  # not 42,000 µs
    assert pick_unit("memory", [20_000.0]) == (1024.0, "GiB")


# -- the command ---------------------------------------------------------------------------------


@pytest.fixture
def configs(tmp_path: Path) -> tuple[Path, Path]:
    slow, fast = tmp_path / "slow.toml", tmp_path / "quick.toml"
    slow.write_text(TINY_TOML.format(ratio=2.0))
    fast.write_text(TINY_TOML.format(ratio=0.5))
    return slow, fast


def test_configs_are_run_and_compared(configs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slow, fast = configs
    out_dir = tmp_path / "runs"
    code, out, err = run_cli(["compare", str(slow), str(fast), "--out", str(out_dir), "--json"], capsys)
    assert code == 0, err
    c = json.loads(out)
    assert [r["label"] for r in c["runs"]] == ["slow", "quick"]
    (folder,) = out_dir.iterdir()
    assert folder.name.startswith("compare-") and len([p for p in folder.iterdir() if p.is_dir()]) == 2
    assert (folder / "compare.png").is_file()  # the figure beside the runs it draws
    records = [read_record(r["run_dirs"][0]) for r in c["runs"]]
    assert [r["config"]["train"]["train_ratio"] for r in records] == [2.0, 0.5]
    rate = row(c, "env_steps_per_s")
    assert rate["cells"][0]["median"] == records[0]["throughput"]["env_steps_per_s"]
    assert (
        rate["ratios"][0]["value"] == records[1]["throughput"]["env_steps_per_s"] / records[0]["throughput"]["env_steps_per_s"]
    )


def test_run_dirs_and_run_json_with_a_config(
    configs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow, fast = configs
    code, out, _ = run_cli(
        ["compare", str(slow), "--vs", "train.train_ratio=1", "--repeats", "2", "--out", str(tmp_path / "runs"), "--json"],
        capsys,
    )
    assert code == 0
    c = json.loads(out)
    assert [r["label"] for r in c["runs"]] == ["slow", "train.train_ratio=1"] and [r["n"] for r in c["runs"]] == [2, 2]
    variant = [read_record(d) for d in c["runs"][1]["run_dirs"]]
    assert [r["config"]["train"]["train_ratio"] for r in variant] == [1.0, 1.0]
    assert [r["config"]["run"]["seed"] for r in variant] == [0, 1]  # repeat k: seed + k
    run_dir = Path(c["runs"][0]["run_dirs"][0])

    # A run directory, a run.json and a config (run now) side by side, as a table.
    code, out, err = run_cli(
        [
            "compare",
            str(run_dir),
            str(Path(c["runs"][1]["run_dirs"][0]) / "run.json"),
            str(fast),
            "--out",
            str(tmp_path / "runs"),
        ],
        capsys,
    )
    assert code == 0, err
    header = next(line for line in out.splitlines() if "metric" in line)
    assert "train.train_ratio=1 vs slow" in header and "quick vs slow" in header
    assert "env steps/s" in out and "×" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["compare", "no/such/run", "other"], "no such run, record or config: no/such/run"),
        (["compare", "{empty}", "{empty}"], "is not a run directory (no run.json)"),
        (["compare", "{run}", "--vs", "train.train_ratio=2"], "--vs needs exactly one config argument"),
        (["compare", "{config}", "{config}", "--repeats", "0"], "--repeats must be at least 1 (got 0)"),
        (["compare", "{run}"], "compare needs at least two runs"),
        (["compare", "{config}", "--vs", "train.train_ratioo=2"], "unknown config key 'train.train_ratioo'"),
        # Every variant is checked before the first run, not when its turn comes.
        (["compare", "{config}", "--vs", "train.train_ratio=2", "--vs", "train.amp=fp16"],
         "train.amp=fp16: train.amp=fp16 needs a CUDA device"),
        (["compare", "{config}", "--vs", "buffer.capacity=1000000000000"], "buffer.capacity=1000000000000: "),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, configs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    run = tmp_path / "a-run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(record()))
    subs = {"{empty}": str(empty), "{run}": str(run), "{config}": str(configs[0])}
    argv = [subs.get(a, a) for a in argv] + ["--out", str(tmp_path / "runs")]
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "runs").exists()


def test_json_has_the_samples_and_parses() -> None:
    sides = [
        Side("a", "a", [record(env_rate=r) for r in (1.0e3, 1.1e3, 1.2e3)]),
        Side("b", "b", [record(env_rate=r) for r in (2.0e3, 2.2e3, 2.1e3)]),
    ]
    c = json.loads(json.dumps(compare(sides)))
    cell = row(c, "env_steps_per_s")["cells"][1]
    assert cell["samples"] == [2000.0, 2200.0, 2100.0] and cell["median"] == 2100.0
    assert c["spread"].startswith("median ±") and c["baseline"] == "a"
