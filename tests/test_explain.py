"""The bottleneck catalogue ships with the package and ``rlperf explain TOPIC`` prints one section of it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import rlperf
from conftest import run_cli
from rlperf.report.explain import find_section, sections

PACKAGE = Path(rlperf.__file__).parent
REPO = PACKAGE.parent
CITED = re.compile(r"docs/bottlenecks\.md §(\d+)")


@pytest.mark.parametrize(("topic", "number"), [("1", 1), ("§3", 3), ("buffer.push", 1), ("buffer.push=loop", 1),
                                               ("train.grad_accum", 12), ("async.wait", 16), ("19", 19)])
def test_explain_prints_the_section_a_number_or_a_knob_names(topic: str, number: int, capsys) -> None:
    code, out, err = run_cli(["explain", topic], capsys)
    assert code == 0 and err == ""
    assert out.startswith(f"## §{number} ") and "## §" not in out[3:]  # that section, and only it


def test_an_unknown_topic_is_one_line_exit_2(capsys) -> None:
    for topic in ("99", "buffer.nope", "§0"):
        code, out, err = run_cli(["explain", topic], capsys)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "buffer.push" in err


def test_no_topic_lists_every_section_knob_and_finding_id_exit_0(capsys) -> None:
    from rlperf.instruments.catalogue import CATALOGUE

    code, out, err = run_cli(["explain"], capsys)
    assert code == 0 and err == ""
    numbered = sections()
    for number, section in numbered.items():
        assert f"§{number} " in out and section.title in out
    words = set(re.findall(r"[\w.]+", out))
    assert {k for s in numbered.values() for k in s.knobs} <= words and set(CATALOGUE) <= words


@pytest.mark.parametrize(("topic", "expected"), [("hostcopy", "host_copy"), ("buffer.psh", "buffer.push"),
                                                 ("garbage", "§13"), ("gc", "train.gc")])
def test_an_unknown_topic_suggests_the_closest_section_knob_or_finding_id(topic: str, expected: str, capsys) -> None:
    code, out, err = run_cli(["explain", topic], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "did you mean" in err and expected in err.partition("did you mean")[2]


@pytest.mark.parametrize("topic", ["³", "①", "§²"])
def test_a_digit_int_refuses_is_an_unknown_topic_not_a_traceback(topic: str, capsys) -> None:
    code, out, err = run_cli(["explain", topic], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_every_finding_id_is_explained_from_the_catalogue(capsys) -> None:
    from rlperf.instruments.catalogue import CATALOGUE, section_for

    for finding_id, item in CATALOGUE.items():
        code, out, err = run_cli(["explain", finding_id], capsys)
        assert code == 0, err
        section = section_for(finding_id)
        if section is not None:  # the section the finding's reference cites
            assert out.startswith(f"## §{section} "), finding_id
        else:  # a checklist item with no section: its catalogue entry
            assert out.startswith(item.title) and item.fix in out, finding_id


def test_every_section_the_package_cites_exists_and_every_hint_names_rlperf_explain() -> None:
    numbered = sections()
    assert sorted(numbered) == list(range(1, max(numbered) + 1)) and all(find_section(str(n)) for n in numbered)
    cited = {int(n) for path in PACKAGE.rglob("*.py") for n in CITED.findall(path.read_text(encoding="utf-8"))}
    assert cited and cited <= set(numbered)
    # The config's key descriptions double as error hints and --help: each names the terminal command too.
    from rlperf.config import Config

    for section in Config.model_fields.values():
        for name, field in section.annotation.model_fields.items():  # type: ignore[union-attr]
            for n in CITED.findall(field.description or ""):
                assert f"rlperf explain {n}" in field.description, name


@pytest.mark.slow
def test_a_built_wheel_holds_the_catalogue_and_every_packaged_config(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    shutil.copytree(PACKAGE, source / "rlperf", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    wheel = next((tmp_path / "dist").glob("rlperf-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "rlperf/docs/bottlenecks.md" in names
    configs = {p.name for p in (PACKAGE / "configs").glob("*.toml")}
    assert "classic.toml" in configs and {f"rlperf/configs/{c}" for c in configs} <= names


def test_the_lists_of_packaged_configs_name_every_one() -> None:
    import rlperf.config
    from rlperf.cli.options import _OPTIONS
    from rlperf.config import packaged_configs

    config_help = _OPTIONS["config"][0].__metadata__[0].help
    for name in packaged_configs():
        assert name in config_help and f"``{name}``" in (rlperf.config.__doc__ or "")
