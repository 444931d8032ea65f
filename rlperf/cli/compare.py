"""``rlperf compare``: runs side by side with ratios and noise marks (library: :mod:`rlperf.experiments.compare`)."""

from __future__ import annotations

import contextlib
import json
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from rlperf.cli.app import OneLineUsageErrors, app, command_stop, rendering
from rlperf.cli.options import RunArgs, run_options
from rlperf.errors import RlperfError
from rlperf.report.units import terminal_safe

if TYPE_CHECKING:
    from rlperf.config import Config
    from rlperf.experiments.compare import Side


def candidate_arguments(args: list[str]) -> list[str]:
    """The command line with every argument after ``--candidate`` up to the next option given to the
    candidate: ``--candidate C1 C2 C3`` (a shell's glob, ``--candidate cand/*/``) becomes ``--candidate
    C1 --candidate C2 --candidate C3``. A click option takes one value; without this the second and
    later candidate records would silently join the baseline, the positional arguments."""
    out: list[str] = []
    taking = value_next = False
    for i, arg in enumerate(args):
        if value_next:  # the value of --candidate itself
            if arg.startswith("-") and arg != "-":
                raise RlperfError(f"--candidate needs a run, record or config before {terminal_safe(arg)}",
                                  hint="rlperf compare BASELINE --candidate CANDIDATE --fail-if-slower 5%")
            out.append(arg)
            value_next = False
        elif arg == "--":  # everything after it is positional: the baseline
            return out + args[i:]
        elif arg == "--candidate" or arg.startswith("--candidate="):
            out.append(arg)
            taking, value_next = True, arg == "--candidate"
        elif arg.startswith("-") and arg != "-":
            out.append(arg)
            taking = False
        else:
            out += ["--candidate", arg] if taking else [arg]
    return out


class CompareCommand(OneLineUsageErrors):
    """``rlperf compare``: several candidate records after one ``--candidate``."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        return super().parse_args(ctx, candidate_arguments(args))


@app.command(cls=CompareCommand)
@run_options()
def compare(
    runs: Annotated[list[str] | None, typer.Argument(
        help="Run directories, run.json files or configs (.toml) to run now.", show_default=False)] = None,
    vs: Annotated[list[str] | None, typer.Option(
        "--vs", help="A variant of the one config argument: --vs buffer.push=loop (repeatable).")] = None,
    repeats: Annotated[int | None, typer.Option(
        "--repeats", help="Runs per config (≥ 3 shows the noise; default 1, and 6 for the gate); repeat k uses seed + k, "
        "except in the gate, where every run uses the config's seed.",
        show_default=False)] = None,
    candidate: Annotated[list[str] | None, typer.Option(
        "--candidate", help="The gate: a config to run now, or run records (every argument after --candidate up to the "
        "next option, e.g. --candidate cand/*/), against the baseline (the other arguments).",
        show_default=False)] = None,
    fail_if_slower: Annotated[str | None, typer.Option(
        "--fail-if-slower", metavar="PCT%", help="The gate (the % sign is required: 5%): exit 0 (PASS) when the candidate "
        "is slower than the baseline by less than PCT% with 95% confidence, 1 (FAIL) when by more, 3 (INCONCLUSIVE) when "
        "the runs cannot tell (the signed-rank interval of the ratio of times per env step for runs made in pairs, "
        "else Welch's t); 2 on bad input.")] = None,
    inconclusive: Annotated[str | None, typer.Option(
        "--inconclusive", metavar="pass|fail", help="The gate: exit 0 (pass) or 1 (fail) on an INCONCLUSIVE verdict, for "
        "a CI that must have two outcomes; without it an INCONCLUSIVE verdict exits 3, which fails a CI step too.",
        show_default=False)] = None,
    max_repeats: Annotated[int | None, typer.Option(
        "--max-repeats", help="The gate, on configs run now: while the verdict is INCONCLUSIVE, run one more interleaved "
        "pair, up to this many runs a side (default 60; --repeats or less: no more runs).", show_default=False)] = None,
    allow_mismatch: Annotated[list[str] | None, typer.Option(
        "--allow-mismatch", metavar="KEY", help="The gate: compare records that differ in KEY (kind, env.id, env.size, "
        "num_envs, device, machine (CPU model, CPU count, usable CPUs), timing, rlperf, config.SECTION.KEY) anyway "
        "(repeatable).", show_default=False)] = None,
    gate_metric: Annotated[str, typer.Option(
        "--gate-metric", help="step-p25+mean: fail when the time per env step at the p25 vector step or the mean "
        "step less the time it waited for a CPU is slower (each at 97.5% confidence), pass when both are not; "
        "step-p25, step-mean, step-median (the median step) or throughput (mean env steps/s) alone.")] = "step-p25+mean",
    *,
    run: RunArgs,
) -> None:
    """Compare runs side by side: phase times, throughput, score, memory, and ratios to the first.

    As a CI gate: rlperf compare BASELINE... --candidate CANDIDATE... --fail-if-slower 5% (configs run
    now on this machine, or records: base/*/ --candidate cand/*/) exits 0 (PASS: less than 5% slower with
    confidence), 1 (FAIL: more), 3 (INCONCLUSIVE: the runs cannot tell; --inconclusive pass|fail maps it),
    2 on bad input. It prints the smallest slowdown the runs could detect and the phases that got slower."""
    from rlperf.experiments.compare import compare as build_comparison
    from rlperf.experiments.compare import load_sources, run_sources
    from rlperf.report.dashboard import RunsProgress

    from rlperf.run.files import check_run_name

    if repeats is not None and repeats < 1:
        raise RlperfError(f"--repeats must be at least 1 (got {repeats})")
    check_run_name(run.name)
    args = list(runs or [])
    if run.config is not None:  # --config names the baseline, like the other commands
        args.insert(0, run.config)

    def make_config(path: str) -> Config:
        return run.build_config(path)

    if (candidate or fail_if_slower is not None or gate_metric != "step-p25+mean" or allow_mismatch
            or inconclusive is not None or max_repeats is not None):
        _gate(args, candidate or [], fail_if_slower, gate_metric, repeats, vs or [], allow_mismatch or [], make_config,
              run, GateOptions(inconclusive, max_repeats))
    repeats = repeats or 1

    sources = load_sources(args, vs or [], make_config)
    to_run = sum(repeats for s in sources if s.config is not None)
    if not to_run and (repeats > 1 or run.given) and not run.json_:
        print("compare: run options and --repeats apply to configs; these records are shown as recorded", file=sys.stderr)
    progress = None if run.quiet or run.json_ or not to_run else RunsProgress("compare", to_run)

    stop = command_stop()
    stop.arm()  # from here a signal stops the run in progress at a step boundary, and no other starts
    with progress or contextlib.nullcontext():
        sides, interrupted = run_sources(sources, repeats, out=run.out, name=run.name, command=sys.argv,
                                         on_run=progress.on_run if progress else None, stop=stop)
    code = stop.exit_code if interrupted else 0
    ran = [r for s, side in zip(sources, sides, strict=True) if s.config is not None for r in side.records]
    sides = [s for s in sides if s.records]
    if len(sides) < 2:
        with rendering():
            print("compare: interrupted before two columns had a run", file=sys.stderr)
        raise typer.Exit(code or stop.exit_code)
    comparison = build_comparison(sides)
    with rendering():
        _show_comparison(comparison, interrupted, run)
        if run.plot:
            from rlperf.cli.figures import draw_comparison

            draw_comparison([(s.label, s.records) for s in sides], ran, run.out, run.name, quiet=run.quiet)
    raise typer.Exit(code)


def _show_comparison(comparison: dict[str, Any], interrupted: bool, run: RunArgs) -> None:
    """The comparison's JSON, or its table and warnings; a note when a signal cut the runs short."""
    if run.json_:
        sys.stdout.write(json.dumps(comparison, indent=2, default=str) + "\n")
    elif run.quiet:
        from rlperf.report.tables import compare_quiet_line

        print(terminal_safe(compare_quiet_line(comparison)))
    else:
        from rlperf.experiments.compare import compare_table
        from rlperf.report.tables import print_table

        print_table(compare_table(comparison))
        for warning in comparison["warnings"]:
            print(terminal_safe(f"warning: {warning}"), file=sys.stderr)
    if interrupted:
        print("compare: interrupted; the table holds the runs that finished", file=sys.stderr)


@dataclass(frozen=True)
class GateOptions:
    """The gate's own options beside its threshold: what an INCONCLUSIVE verdict exits with, and how many
    runs a side adaptive repeats may reach."""

    inconclusive: str | None = None
    max_repeats: int | None = None


def _gate(baseline_args: list[str], candidate_args: list[str], fail_if_slower: str | None, metric: str,
          repeats: int | None, vs: list[str], allow: list[str], make_config: Any, run: RunArgs,
          options: GateOptions) -> None:
    """``--candidate ... --fail-if-slower PCT``: run or read both sides (adding pairs while inconclusive),
    print the table and the verdict, exit 0, 1 or 3."""
    from rlperf.experiments import gate
    from rlperf.report.dashboard import RunsProgress

    threshold = _check_gate_options(candidate_args, fail_if_slower, metric, vs, allow, options)
    repeats_given, repeats = repeats is not None, repeats or gate.DEFAULT_REPEATS
    most = max(repeats, options.max_repeats if options.max_repeats is not None else gate.DEFAULT_MAX_REPEATS)
    baseline = gate.load_side(baseline_args, "baseline", make_config)
    candidate = gate.load_side(candidate_args, "candidate", make_config)
    gate.check_duplicates(baseline + candidate)
    gate.check_records(baseline + candidate, gate.required(metric))
    counts = [repeats if side[0].config is not None else len(side) for side in (baseline, candidate)]
    _check_counts(counts[0], counts[1])
    gate.check_sources(baseline, candidate, allow)
    configs = sum(1 for side in (baseline, candidate) if side[0].config is not None)
    if not configs and (repeats_given or options.max_repeats is not None or run.given) and not run.json_:
        print("compare: run options, --repeats and --max-repeats apply to configs; these records are gated as recorded",
              file=sys.stderr)
    progress = None if run.quiet or run.json_ or not configs else RunsProgress("gate", configs * repeats)
    paired = configs == 2  # the gate runs both sides itself, in interleaved pairs
    adaptive = bool(configs) and most > repeats  # the verdict looks after every pair: each look's PASS is stricter

    def undecided(base: Side, cand: Side) -> bool:
        """Whether the runs so far leave the verdict inconclusive (then one more pair runs)."""
        verdict = gate.result(base, cand, threshold, metric, allow, options.inconclusive, paired, adaptive)[0]["verdict"]
        if verdict == "inconclusive" and progress is not None:
            progress.bar.update(progress.task, total=(progress.bar.tasks[0].total or 0) + configs)
        return verdict == "inconclusive"

    stop = command_stop()
    stop.arm()  # a signal stops the run in progress at a step boundary; no verdict then
    with progress or contextlib.nullcontext():
        base, cand, interrupted = gate.gather(baseline, candidate, repeats, metric, max_repeats=most,
                                              undecided=undecided, out=run.out, name=run.name, command=sys.argv,
                                              on_run=progress.on_run if progress else None, stop=stop)
    if interrupted:
        with rendering():
            print("compare: interrupted; no verdict", file=sys.stderr)
        raise typer.Exit(stop.exit_code)
    paired = paired or (not configs and gate.pair_records(base, cand))  # records run in pairs, e.g. the CI recipe
    result, (b, c) = gate.result(base, cand, threshold, metric, allow, options.inconclusive, paired, adaptive)
    if configs:
        ran = max(len(side.records) for side, s in ((base, baseline[0]), (cand, candidate[0])) if s.config is not None)
        result["repeats"] = {"first": repeats, "ran": ran, "max": most}
        if paired and adaptive:
            gate.add_reach(result, most)
    with rendering():
        _show_gate(result, run)
        if run.plot:
            from rlperf.cli.figures import draw_comparison

            ran_records = [r for s, side in ((baseline[0], base), (candidate[0], cand)) if s.config is not None
                           for r in side.records]
            draw_comparison([(base.label, base.records), (cand.label, cand.records)], ran_records, run.out, run.name,
                            prefix="gate", quiet=run.quiet, gate=result, gate_samples=(b, c))
    raise typer.Exit(result["exit_code"])


def _check_gate_options(candidate_args: list[str], fail_if_slower: str | None, metric: str, vs: list[str],
                        allow: list[str], options: GateOptions) -> float:
    """Refuse a gate that is missing a side or its threshold, or mixes in --vs or an unknown metric,
    mismatch key or --inconclusive value; returns the threshold."""
    from rlperf.experiments import gate

    if not candidate_args:
        raise RlperfError("--fail-if-slower needs --candidate", hint="rlperf compare BASELINE --candidate CONFIG "
                          "--fail-if-slower 5%")
    if fail_if_slower is None:
        raise RlperfError("--candidate is the CI gate: give its threshold", hint="add --fail-if-slower 5%")
    if vs:
        raise RlperfError("--vs does not combine with --candidate", hint="give the candidate as a config or records")
    if metric not in gate.METRICS:
        raise RlperfError(f"unknown --gate-metric {metric!r}", hint=f"use {' or '.join(gate.METRICS)}")
    if options.inconclusive not in (None, "pass", "fail"):
        raise RlperfError(f"--inconclusive {options.inconclusive!r} is not pass or fail",
                          hint="without it an INCONCLUSIVE verdict exits 3; --inconclusive fail: 1, pass: 0")
    if options.max_repeats is not None and options.max_repeats < 1:
        raise RlperfError(f"--max-repeats must be at least 1 (got {options.max_repeats})")
    threshold = gate.parse_threshold(fail_if_slower)
    gate.check_allowed(allow)
    return threshold


def _check_counts(n: int, m: int) -> None:
    """Refuse sides too small for a spread, before anything runs."""
    from rlperf.experiments import gate

    if min(n, m) < gate.MIN_RUNS:
        raise RlperfError(f"{n} baseline and {m} candidate runs have no spread to test",
                          hint=f"run each side at least {gate.MIN_RUNS} times (--repeats {gate.DEFAULT_REPEATS} is the "
                               "default), or pass more records")


def _show_gate(result: dict[str, Any], run: RunArgs) -> None:
    """The gate's JSON, or its table, what was compared, the config changes, the verdict, what the runs
    could detect, why it got slower, and the warnings."""
    from rlperf.experiments import gate

    if run.json_:
        sys.stdout.write(json.dumps(result, indent=2, default=str) + "\n")
        return
    if run.quiet:  # the verdict alone
        print(terminal_safe(gate.verdict_line(result)))
        return
    from rlperf.experiments.compare import compare_table
    from rlperf.report.tables import print_table

    print_table(compare_table(result["comparison"], title="gate"))
    print(terminal_safe(gate.compared_line(result)))
    if result["config_changes"]:
        print(terminal_safe(f"the sides differ in config: {'; '.join(result['config_changes'])}"))
    if result.get("repeats") and result["repeats"]["ran"] > result["repeats"]["first"]:
        r = result["repeats"]
        print(f"adaptive repeats: {r['ran']} runs a side ({r['first']} first, then one pair at a time while "
              f"inconclusive, at most {r['max']})")
    print(terminal_safe(gate.verdict_line(result)))
    if result.get("detectable_slowdown") is not None:
        print(terminal_safe(gate.detectable_line(result)))
    if result["why"]:
        print(terminal_safe(result["why"]))
    for warning in result["warnings"]:
        print(terminal_safe(f"warning: {warning}"), file=sys.stderr)
