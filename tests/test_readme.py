"""The README's samples and the Snake's snippets for other libraries (docs/snake.md) run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNAKE_DOC = Path(__file__).resolve().parents[1] / "docs" / "snake.md"
SECTION = "## Using rlperf's Snake from SB3, CleanRL and TorchRL"


def section_snippets() -> list[str]:
    text = SNAKE_DOC.read_text(encoding="utf-8")
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start:end], flags=re.S)


def test_the_section_has_its_snippets():
    snippets = section_snippets()
    assert len(snippets) == 3
    assert "stable_baselines3" in snippets[0] and "torchrl" in snippets[1] and "RecordEpisodeStatistics" in snippets[2]


@pytest.mark.parametrize("index", [0, 1, 2], ids=["sb3", "torchrl", "gymnasium-wrappers"])
def test_readme_snippet_runs(index, tmp_path, monkeypatch, capsys):
    code = section_snippets()[index]
    for module in re.findall(r"^(?:from|import) (\w+)", code, flags=re.M):
        pytest.importorskip("array_api_compat" if "ArrayConversion" in code and module == "gymnasium" else module)
    monkeypatch.chdir(tmp_path)  # whatever a snippet writes lands here
    namespace: dict = {}
    exec(compile(code, f"docs/snake.md snippet {index}", "exec"), namespace)
    if index == 0:
        assert namespace["model"].num_timesteps >= 2_000
    elif index == 1:
        assert tuple(namespace["rollout"].batch_size) == (256, 100)
    else:
        assert "episodes, mean return" in capsys.readouterr().out


# The guide's samples: each is a command's real output, written by scripts/readme_samples.py; these tests run each
# command as the README shows it and check it still exits as shown and prints the stable parts the README shows.

ROOT = README.parent


def samples_module():
    """scripts/readme_samples.py, imported from its file (scripts/ is not a package)."""
    import importlib.util
    import sys

    if "readme_samples" not in sys.modules:
        spec = importlib.util.spec_from_file_location("readme_samples", ROOT / "scripts" / "readme_samples.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["readme_samples"] = module  # dataclasses look their module up while the file runs
        spec.loader.exec_module(module)
    return sys.modules["readme_samples"]


SAMPLES = samples_module().SAMPLES
SLOW = {"profile-script", "sweep", "gate"}  # several runs, or a script under every instrument


def test_the_readme_starts_with_the_two_commands_ci_runs():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# rlperf" and lines[2] == "```bash" and lines[5] == "```"
    assert lines[3].endswith("pip install -e . && rlperf train")
    assert lines[4] == 'pip install -e ".[dev,ray,bench]" && python -m pytest -q'
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -q -e ".[dev,ray,bench]" && "$PY" -m pytest -q' in ci


def test_every_sample_has_its_block_and_shows_its_stable_parts():
    module = samples_module()
    blocks = module.readme_blocks(README.read_text(encoding="utf-8"))
    assert set(blocks) == {s.name for s in SAMPLES}
    for sample in SAMPLES:
        # the command's own parts are checked by the runs below; here only what the README shows
        assert module.problems(sample, sample.codes[0], "\n".join(sample.shows), blocks[sample.name]) == []


def test_the_readme_names_only_files_that_exist():
    text = README.read_text(encoding="utf-8")
    named = set(re.findall(r"(?<![\w./:-])((?:configs|scripts|docs|tests|rlperf)/[\w./-]*[\w/])", text))
    paths = {p for p in named if p.endswith("/") or "." in p.rsplit("/", 1)[-1]}  # not ids like rlperf/Snake-v0
    assert "configs/smoke.toml" in paths and "docs/profiling-internals.md" in paths
    assert sorted(p for p in paths if not (ROOT / p).exists()) == []


@pytest.fixture(scope="module")
def sample_runs(request: pytest.FixtureRequest):
    """Every selected sample's (exit code, output), two commands at a time, longest first: each is one or a few
    cold torch processes, one core busy; side by side they use both. A test waits for its own."""
    from concurrent.futures import ThreadPoolExecutor

    module = samples_module()
    wanted = {item.callspec.id for item in request.session.items if item.module is request.module
              and item.originalname == "test_readme_sample_command_runs_and_prints_what_the_readme_shows"}
    order = sorted((s for s in SAMPLES if s.name in wanted), key=lambda s: s.name not in SLOW)
    with module.scratch_folder() as folder, ThreadPoolExecutor(max_workers=2) as pool:
        futures = {s.name: pool.submit(module.run, s, folder, 280) for s in order}
        yield futures


@pytest.mark.parametrize("sample", [pytest.param(s, id=s.name, marks=[pytest.mark.slow] if s.name in SLOW else [])
                                    for s in SAMPLES])
def test_readme_sample_command_runs_and_prints_what_the_readme_shows(sample, sample_runs):
    module = samples_module()
    code, output = sample_runs[sample.name].result()
    block = module.readme_blocks(README.read_text(encoding="utf-8")).get(sample.name)
    assert module.problems(sample, code, output, block) == []

def test_a_sample_block_drops_progress_cuts_what_it_omits_and_shows_paths_from_the_repository():
    module = samples_module()
    sample = module.Sample("x", "rlperf x", shows=("kept",), omit=((r"^cut from", r"^kept"),), head=3)
    output = ("[100/2,000 env steps] episodes 3\nsweep ━━━━━━━━━━━━━━━━ 1/2\nrlperf: note: load average 9 on 2 CPUs\n"
              "cut from here\ncut too\nkept /scratch/runs/x-1\nafter\nmore\n")
    assert module.block(sample, output, "/scratch") == "```text\n$ rlperf x\n…\nkept runs/x-1\nafter\n…\n```\n"
    assert module.problems(sample, 0, output, module.block(sample, output, "/scratch")) == []
    assert module.problems(sample, 1, "", None) == [
        "x: `rlperf x` exited 1, not (0,):\n", "x: the command no longer prints 'kept'",
        "x: README.md has no <!-- sample: x --> block"]


def test_a_trimmed_sample_keeps_its_first_line_and_cuts_what_follows_up_to_the_line_after():
    module = samples_module()
    sample = module.Sample("x", "rlperf x", shows=("measured: 64",), trim=((r"^measured: ", r"^gc: "), (r"^absent", r"^x")))
    output = "measured: 64 vector steps, after\nthe wrapped rest\ntable\ngc: 1 collections\nmore\n"
    assert module.shown(sample, output) == "measured: 64 vector steps, after\n…\ngc: 1 collections\nmore"
    nothing_between = module.Sample("x", "rlperf x", shows=(), trim=((r"^gc: ", r"^more"),))
    assert module.shown(nothing_between, output) == output.rstrip("\n")
