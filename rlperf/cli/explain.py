"""``rlperf explain [TOPIC]``: one section of the bottleneck catalogue in the terminal (library:
:mod:`rlperf.report.explain`), from the copy the package ships."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from rlperf.cli.app import command


@command()
def explain(
    topic: Annotated[str | None, typer.Argument(
        help="A section number (3 or §3), a knob (buffer.push), or a finding id from rlperf profile (host_copy); "
             "none: list them all.")] = None,
) -> None:
    """Print one section of docs/bottlenecks.md, the catalogue findings and hints cite; with no topic, list the topics."""
    from rlperf.instruments.catalogue import CATALOGUE, describe, section_for
    from rlperf.report.explain import section_text, topics_text

    if topic is None:
        sys.stdout.write(topics_text(CATALOGUE) + "\n")
        return
    if topic in CATALOGUE and section_for(topic) is None:  # a checklist item without a section of its own
        sys.stdout.write(describe(topic) + "\n")
        return
    sys.stdout.write(section_text(topic, section_for(topic), CATALOGUE) + "\n")
