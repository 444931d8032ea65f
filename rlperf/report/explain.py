"""The bottleneck catalogue as the package ships it (``rlperf/docs/bottlenecks.md``), one section at a time.

Every finding and hint cites "docs/bottlenecks.md §N"; ``rlperf explain N`` prints that section in
the terminal, so a user who installed rlperf from a wheel can read it. A section is found by its
number (``3``, ``§3``) or by a knob its heading names (``buffer.push``, also ``buffer.push=loop``).
Finding ids live in :mod:`rlperf.instruments.catalogue` (above this module), so the caller passes them in.
"""

from __future__ import annotations

import difflib
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources

from rlperf.errors import RlperfError

_HEADING = re.compile(r"^## §(\d+) (.+)$", re.MULTILINE)
_LEVEL_TWO = re.compile(r"^## ", re.MULTILINE)
_KNOB = re.compile(r"\b[a-z_]+\.[a-z_]+\b")
# ASCII digits only: str.isdigit also accepts "³" and "①", which int() refuses.
_NUMBER = re.compile(r"[0-9]+")


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
    if _NUMBER.fullmatch(key):
        return all_sections.get(int(key))
    knob = key.partition("=")[0].strip()
    return next((s for s in all_sections.values() if knob in s.knobs), None)


def topics_text(finding_ids: Iterable[str]) -> str:
    """Every topic ``rlperf explain`` takes: the sections with their titles, the knobs, the finding ids."""
    found = sections()
    lines = ["Sections of docs/bottlenecks.md (rlperf explain N):"]
    lines += [f"  §{n:<3} {s.title}" for n, s in sorted(found.items())]
    lines += ["", "Knobs (rlperf explain KNOB):", _listing(_knobs(found))]
    lines += ["", "Finding ids from rlperf profile (rlperf explain ID):", _listing(sorted(finding_ids))]
    return "\n".join(lines)


def section_text(topic: str, number: int | None = None, finding_ids: Iterable[str] = ()) -> str:
    """The text of the section ``topic`` names (or of section ``number``, when a caller resolved the
    topic itself); an unknown topic is a one-line RlperfError naming the closest topics."""
    found = sections()
    section = found.get(number) if number is not None else find_section(topic)
    if section is None:
        raise unknown_topic(topic, finding_ids, found)
    return section.text


def unknown_topic(topic: str, finding_ids: Iterable[str], found: dict[int, Section] | None = None) -> RlperfError:
    """The one-line error for a topic that names nothing: the closest section, knob and finding id."""
    found = sections() if found is None else found
    key = topic.strip().removeprefix("§").lower()
    candidates = {f"§{n}": s.title.lower() for n, s in found.items()}  # a section matches by its title
    candidates |= {k: k for k in _knobs(found)}
    candidates |= {f: f for f in finding_ids}
    by_text = {text: name for name, text in candidates.items()}
    close = [by_text[t] for t in difflib.get_close_matches(key, list(by_text), n=3, cutoff=0.5)]
    close += [name for name, text in candidates.items() if len(key) >= 2 and key in text and name not in close]
    listing = "rlperf explain with no topic lists every one"
    hint = (f"did you mean {', '.join(close[:3])}? {listing}" if close else
            f"give a section number 1-{max(found)}, a knob (buffer.push) or a finding id (host_copy); {listing}")
    return RlperfError(f"no topic {topic!r} in docs/bottlenecks.md", hint=hint)


def _listing(names: list[str]) -> str:
    return textwrap.fill(", ".join(names), width=96, initial_indent="  ", subsequent_indent="  ", break_on_hyphens=False)


def _knobs(found: dict[int, Section]) -> list[str]:
    return sorted({k for s in found.values() for k in s.knobs})
