"""``rlperf explain TOPIC``: one section of the bottleneck catalogue in the terminal (library:
:mod:`rlperf.report.explain`), from the copy the package ships."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rlperf.cli.app import command


@command()
def explain(
    topic: Annotated[str, typer.Argument(
        help="A section number (3 or §3), a knob (buffer.push), or a finding id from rlperf profile.")],
) -> None:
    """Print one section of docs/bottlenecks.md, the catalogue findings and hints cite."""
    from rlperf.report.explain import section_text

    sys.stdout.write(section_text(topic, finding_section(topic)) + "\n")


def finding_section(topic: str) -> int | None:
    """The section a finding id names, from the advisor's catalogue of bottlenecks (None: not a finding id,
    or no catalogue in this build)."""
    try:
        from rlperf.instruments.catalogue import section_for  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return None
    section: int | None = section_for(topic)
    return section
