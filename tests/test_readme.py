"""The README's snippets for other libraries run as written (its "Using rlperf's Snake from ..." section)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Using rlperf's Snake from SB3, CleanRL and TorchRL"


def section_snippets() -> list[str]:
    text = README.read_text(encoding="utf-8")
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
    exec(compile(code, f"README.md snippet {index}", "exec"), namespace)
    if index == 0:
        assert namespace["model"].num_timesteps >= 2_000
    elif index == 1:
        assert tuple(namespace["rollout"].batch_size) == (256, 100)
    else:
        assert "episodes, mean return" in capsys.readouterr().out
