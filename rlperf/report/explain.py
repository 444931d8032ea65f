"""The bottleneck catalogue as the package ships it (``rlperf/docs/bottlenecks.md``), one section at a time.

Every finding and hint cites "docs/bottlenecks.md §N"; ``rlperf explain N`` prints that section in
the terminal, so a user who installed rlperf from a wheel can read it. A section is found by its
number (``3``, ``§3``) or by a knob its heading names (``buffer.push``, also ``buffer.push=loop``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from rlperf.errors import RlperfError

_HEADING = re.compile(r"^## §(\d+) (.+)$", re.MULTILINE)
_LEVEL_TWO = re.compile(r"^## ", re.MULTILINE)
_KNOB = re.compile(r"\b[a-z_]+\.[a-z_]+\b")


@dataclass(frozen=True)
class Section:
    """One numbered section: its number, its heading's title, the knobs the heading names, its text."""

    number: int
    title: str
    knobs: tuple[str, ...]
    text: str


def catalogue_text() -> str:
    """The whole catalogue, read from the installed package."""
    return (resources.files("rlperf") / "docs" / "bottlenecks.md").read_text(encoding="utf-8")


def sections(text: str | None = None) -> dict[int, Section]:
    """The numbered sections (``## §N Title — knob, knob``), each up to the next heading of its level."""
    text = catalogue_text() if text is None else text
    found: dict[int, Section] = {}
    starts = [m.start() for m in _LEVEL_TWO.finditer(text)]
    for head in _HEADING.finditer(text):
        end = next((s for s in starts if s > head.start()), len(text))
        body = text[head.start():end].rstrip().removesuffix("---").rstrip()
        title = head.group(2)
        knobs = tuple(_KNOB.findall(title.partition(" — ")[2]))
        found[int(head.group(1))] = Section(int(head.group(1)), title, knobs, body)
    return found


def find_section(topic: str, text: str | None = None) -> Section | None:
    """The section ``topic`` names: a number (``3``, ``§3``) or a knob (``buffer.push[=value]``); None if none."""
    all_sections = sections(text)
    key = topic.strip().removeprefix("§")
    if key.isdigit():
        return all_sections.get(int(key))
    knob = key.partition("=")[0].strip()
    return next((s for s in all_sections.values() if knob in s.knobs), None)


def section_text(topic: str, number: int | None = None) -> str:
    """The text of the section ``topic`` names (or of section ``number``, when a caller resolved the
    topic itself); an unknown topic is a one-line RlperfError listing what can be asked for."""
    found = sections()
    section = found.get(number) if number is not None else find_section(topic)
    if section is None:
        knobs = sorted({k for s in found.values() for k in s.knobs})
        raise RlperfError(f"no section of docs/bottlenecks.md for {topic!r}",
                          hint=f"give a section number 1-{max(found)} or a knob: {', '.join(knobs)}")
    return section.text
