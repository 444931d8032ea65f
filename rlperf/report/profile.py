"""Rendering a profiled run: the phase table with the instruments' overhead, cProfile's top
functions, torch.profiler's top ops, GC, artifacts and the advisor's findings (rich renderables
from a record's ``profile`` section; nothing here measures)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from rlperf.report.units import percent_short, seconds_short

def cprofile_table(section: Mapping[str, Any], title: str = "cProfile", own: str = "rlperf's own code") -> Table:
    """The top functions of a record's ``profile.cprofile`` section; ``own`` code (rlperf's, or the
    profiled script's) in bold with a ●."""
    sort = section.get("sort", "cumtime")
    caption = (f"{section.get('total_calls', 0):,} calls in {section.get('total_s', 0.0):.2f} s of profiled time; "
               f"times in s, sorted by {sort}; ● = {own}")
    table = Table(title=title, caption=caption)
    table.add_column("", width=1, no_wrap=True)
    table.add_column("function", overflow="fold", ratio=1)
    for header in ("ncalls", "tottime", "cumtime", "ms/call"):
        table.add_column(header + (" ▼" if header == sort else ""), justify="right", no_wrap=True)
    for row in section.get("top", []):
        ncalls, primitive = row["ncalls"], row["primitive_calls"]
        calls = f"{ncalls:,}" if ncalls == primitive else f"{ncalls:,}/{primitive:,}"
        per_call = 1e3 * row["cumtime"] / ncalls if ncalls else 0.0
        style = "bold cyan" if row["own"] else None
        table.add_row("●" if row["own"] else "", Text(row["function"], style=style or ""), calls,
                      f"{row['tottime']:.3f}", f"{row['cumtime']:.3f}", f"{per_call:.3g}")
    return table


def torch_ops_table(section: Mapping[str, Any], key: str = "top_ops",
                    title: str = "torch.profiler: top ops by self CPU time") -> Table:
    """The top ops of a record's ``profile.torch`` section (``key``: top_ops or top_device_ops)."""
    steps = section.get("steps", ["?", "?"])
    s = section.get("schedule") or {}
    table = Table(title=title, caption=f"vector steps {steps[0]}–{steps[1]} (schedule: wait {s.get('wait')}, "
                                       f"warmup {s.get('warmup')}, active {s.get('active')})")
    rows = section.get(key, [])
    device = any("self_device_ms" in r for r in rows)
    table.add_column("op", overflow="fold")
    for header in ("calls", "self CPU ms", "CPU total ms") + (("self device ms",) if device else ()):
        table.add_column(header, justify="right")
    for r in rows:
        cells = [r["op"], f"{r['calls']:,}", f"{r['self_cpu_ms']:.3f}", f"{r['cpu_total_ms']:.3f}"]
        if device:
            cells.append(f"{r.get('self_device_ms', 0.0):.3f}")
        table.add_row(*cells)
    return table


def render_findings(findings: Sequence[Mapping[str, Any]], total_s: float, none_reason: str | None = None) -> RenderableType:
    """The advisor's findings as numbered paragraphs (from their record form)."""
    if not findings:
        return Text(none_reason or "no finding", style="green")
    parts: list[RenderableType] = [Text("advisor: findings ranked by the time they could save", style="bold")]
    for i, f in enumerate(findings, 1):
        head = Text(f"{i}. {f['title']}", style="bold yellow")
        saving = f.get("est_saving_s")
        if saving is not None:
            share = f" ({percent_short(saving / total_s)})" if total_s > 0 else ""
            head.append(f" — could save ~{seconds_short(saving)} of {seconds_short(total_s)}{share}", style="bold")
        if f.get("where"):
            head.append(f" — in {f['where']}")
        # A finding on your script is fixed at its line (the call to change); rlperf's own loop by a knob (try:).
        fix = f"   fix at {f['where']}: {f['fix']}" if f.get("where") and not f.get("knob") else f"   fix: {f['fix']}"
        parts += [head, Text(f"   evidence: {f['evidence']}"), Text(fix)]
        expected = f"   expected: {f['expected_gain']}; see {f['reference']}"
        if f.get("knob"):
            parts.append(Text.assemble("   try: ", (f"--set {f['knob']}", "bold cyan"), expected))
        else:
            parts.append(Text(expected))
        parts.append(Text(f"   estimate: {f['estimate']}"))
        if f.get("command"):
            parts.append(Text.assemble("   verify: ", (f["command"], "cyan")))
        verified = f.get("verified")
        if verified:
            parts.append(Text(f"   measured: {verified_text(verified, saving, total_s)}", style="bold"))
    return Group(*parts)


def verified_text(v: Mapping[str, Any], saving: float | None, total_s: float) -> str:
    """The measured gain of a finding's compare line beside its estimate (``profile --verify``)."""
    if v.get("error"):
        return f"not verified: {v['error']}"
    if "saving_s" in v:  # a script re-run as it is and with the fix applied (rlperf.instruments.script_verify)
        text = (f"saved {seconds_short(v['saving_s'])} ({v['baseline_s']:.2f} s -> {v['fixed_s']:.2f} s, medians of "
                f"{v['repeats']} interleaved runs of the script alone: {v['how']})")
        if v.get("inside_noise"):
            text += " (inside the noise: the runs overlap)"
        return text + (f"; estimated {seconds_short(saving)}" if saving is not None else "")
    speedup, spread = v["speedup"], v.get("spread") or 0.0
    text = f"{speedup:.2f}× ± {spread:.2f} env steps/s over {v['repeats']} interleaved repeats"
    if v.get("inside_noise"):
        text += " (inside the noise: the ranges overlap)"
    if saving is not None and 0 < saving < total_s:
        text += f"; estimated {total_s / (total_s - saving):.2f}× of the measured phase time"
    return text


def overhead_line(section: dict[str, Any]) -> str:
    o = section.get("overhead") or {}
    if "ratio" not in o or o["ratio"] is None:
        return f"instrument overhead: {o.get('skipped', 'not measured')}"
    names = {"before_learning": "before learning starts", "training": "while training"}
    parts = ", ".join(f"×{r:.2f} {names[k]}" for k, r in o["by_regime"].items())
    line = (f"instrument overhead: {' + '.join(o['instruments'])} ×{o['ratio']:.2f} over the run ({parts}): vector "
            f"steps {o['steps'][0]}–{o['steps'][1]} took {o['replayed_profiled_s']:.2f} s profiled vs "
            f"{o['replayed_plain_s']:.2f} s replayed without instruments (same seed, same process)")
    if o["ratio"] < 1:
        line += "; below 1, so noise exceeded the instruments' cost on this run"
    return line


def window_line(section: Mapping[str, Any]) -> str | None:
    """What the profile measured, and what it left out before the window (a record's ``profile.window``)."""
    w = section.get("window")
    if not w:
        return None
    line = (f"measured: {w['measured_steps']:,} vector steps ({w['measured_env_steps']:,} env steps, "
            f"{w['measured_episodes']:,} episodes, {w['measured_updates']:,} updates) in {w['measured_s']:.2f} s, after "
            f"filling the replay to train.learning_starts={w['learning_starts']:,} ({w['fill_steps']} vector steps, "
            f"{w['fill_s']:.2f} s) and {w['warmup_steps']} warm-up steps ({w['warmup_s']:.2f} s), both left out")
    if w.get("extended"):
        asked = w["asked"]
        what = (f"--episodes {asked['episodes']:,}" if "episodes" in asked else f"--steps {asked['env_steps']:,}")
        line += (f"; {what} took {w['asked_steps']} vector steps, fewer than the {w['min_steps']} a stable p95 needs, "
                 f"so the window was extended to {w['min_steps']}")
    return line


def render_profile(record: dict[str, Any], quiet: bool = False) -> None:
    """Print a profiled run: phases, summary, cProfile, torch ops, GC, overhead, artifacts, advisor."""
    from rlperf.report.tables import episode_growth_line, phase_table, stdout_console, summary_table

    console = stdout_console()
    p = record["profile"]
    o = p.get("overhead") or {}
    mode = record["timing"]["mode"]
    if o.get("ratio"):
        mode += f"; measured under {' + '.join(o['instruments'])} (×{o['ratio']:.2f} overhead)"
    console.print(phase_table(record["phases"], title="phases", timing_mode=mode))
    console.print(summary_table(record))
    window = window_line(p)
    if window:
        console.print(window, highlight=False, markup=False)
    growth = episode_growth_line(record)
    if growth:
        console.print(growth, highlight=False, markup=False)
    if p.get("cprofile"):
        console.print(cprofile_table(p["cprofile"], title=f"cProfile: top {len(p['cprofile']['top'])} functions"))
    t = p.get("torch")
    if t:
        if t.get("recorded"):
            console.print(torch_ops_table(t))
            if t.get("top_device_ops"):
                console.print(torch_ops_table(t, "top_device_ops", "torch.profiler: top ops by self device time"))
        else:
            console.print(f"torch.profiler: {t.get('note')}", markup=False)
    _pyspy_and_gc_lines(console, p, "the loop")
    console.print(overhead_line(p), highlight=False, markup=False)
    _artifacts_and_findings(console, record, p)
    v = p.get("verify")
    if v:
        line = (f"verified: {v['ran']} compare line(s), {v.get('repeats', 0)} interleaved repeats each, runs in "
                f"{v['compare_dir']}" if v.get("ran") else f"verify: {v.get('note', 'interrupted before a run finished')}")
        console.print(line, highlight=False, soft_wrap=True, markup=False)
        for warning in v.get("warnings") or []:
            console.print(f"warning: {warning}", highlight=False, soft_wrap=True, markup=False)
    status = record["status"]
    if not quiet or status != "completed":
        line = f"run {record['name']}: {status} -> {record['run_dir']}"
        if status == "failed":
            line += f" ({record.get('error', 'see run.json')})"
        print(line, file=sys.stderr)


def notes(record: dict[str, Any]) -> list[str]:
    """Caveats about the evidence: a run too short to profile, a machine too busy to time."""
    found = []
    short = _short_run_note(record)
    if short:
        found.append(short)
    load = record["profile"].get("load") or {}
    if load.get("loadavg_1m", 0.0) > load.get("cpus", 1.0) + 0.5:
        found.append(f"note: load average {load['loadavg_1m']:.1f} on {load['cpus']:g} CPUs at the end of the run: "
                     f"other processes competed for the CPUs, so timings and the overhead ratio are noisy")
    return found


def _short_run_note(record: dict[str, Any]) -> str | None:
    timing, totals = record["timing"], record["totals"]
    if timing["measured_steps"] == 0:
        return (f"note: the run was {totals['vector_steps']} vector steps, all of them warm-up "
                f"({timing['warmup_steps']}); the profile shows start-up, not the loop: run longer (--steps 50000)")
    if totals["updates"] == 0:
        return "note: the run ended before the first gradient update (train.learning_starts); train is not profiled"
    return None


PHASE_API_HINT = ("timer = rlperf.PhaseTimer(device); with timer.phase(\"step\"): ...; timer.step_done() "
                  "(README: Profile your own loop)")


def render_script_profile(record: dict[str, Any], quiet: bool = False) -> None:
    """Print a profiled script: its phase table (or how to get one), cProfile with its own code marked,
    torch.profiler, GC, artifacts and the advisor's findings; then where the run directory is."""
    from rlperf.report.tables import phase_table, stdout_console

    console = stdout_console()
    p = record["profile"]
    script = record["script"]
    if record.get("phases"):
        timing = record["timing"]
        console.print(phase_table(record["phases"], title="your loop's phases", timing_mode=timing["mode"]))
        step = timing.get("vector_step") or {}
        console.print(f"{timing['measured_steps']:,} steps measured (after {timing['warmup_steps']} warm-up) in "
                      f"{timing['measured_wall_s']:.2f} s: {record['throughput']['steps_per_s']:,.1f} steps/s, median step "
                      f"{step.get('p50_ms', 0.0):.3g} ms" + (f" (rlperf.PhaseTimer: {script['phase_timers']} timers, the "
                      f"busiest shown)" if script["phase_timers"] > 1 else ""), highlight=False, markup=False)
        if script.get("phase_timer_process"):
            console.print(f"these phases are timed in process {script['phase_timer_process']}, which the script started; "
                          "cProfile, the GC figures and the advisor below see the script's main process only: profile "
                          "the worker's loop on its own (or run py-spy record --subprocesses) to see inside it",
                          highlight=False, soft_wrap=True, markup=False)
    elif script.get("phase_timers"):  # a timer that only counts steps (a callback's step_done())
        steps = int((record.get("totals") or {}).get("vector_steps") or 0)
        console.print(f"no phase timings: the script's rlperf.PhaseTimer timed no phase ({steps:,} timer.step_done() "
                      "calls, the advisor's steps); put parts of the loop in with timer.phase(\"step\"): ... for the "
                      "phase table (README: Profile your own loop)", highlight=False, soft_wrap=True, markup=False)
    elif script.get("from_snapshot"):  # what the script did after its last snapshot is not known
        console.print("no phase timings: the script ended before it could write its profile, and its last snapshot "
                      "held no rlperf.PhaseTimer", highlight=False, soft_wrap=True, markup=False)
    else:
        console.print(f"no phase timings: the script does not use rlperf.PhaseTimer; three lines give you the phase "
                      f"table: {PHASE_API_HINT}", highlight=False, soft_wrap=True, markup=False)
    if p.get("cprofile"):
        console.print(cprofile_table(p["cprofile"], title=f"cProfile: top {len(p['cprofile']['top'])} functions",
                                     own=p.get("own", "your code")))
    t = p.get("torch")
    if t:
        if t.get("recorded"):
            console.print(torch_ops_table(t))
        else:
            console.print(f"torch.profiler: {t.get('note')}", highlight=False, soft_wrap=True, markup=False)
    _pyspy_and_gc_lines(console, p, "the script")
    pools = thread_pools_line(p)
    if pools:
        console.print(pools, highlight=False, soft_wrap=True, markup=False)
    overhead = script_overhead_line(record)
    if overhead:
        console.print(overhead, highlight=False, soft_wrap=True, markup=False)
    _artifacts_and_findings(console, record, p)
    if not quiet or record["status"] != "completed":
        print(f"{' '.join(script['command'])}: exit code {record['exit_code']} ({script['wall_s']:.1f} s) -> "
              f"{record['run_dir']}", file=sys.stderr)


def thread_pools_line(p: Mapping[str, Any]) -> str | None:
    """The thread pools the script ended with against the CPUs it could use and the load, and the most
    threads its processes kept busy at once."""
    info = p.get("threads") or {}
    if not info:
        return None
    pools = [f"{pool['package']}'s {pool['library']}" + (f" {pool['version']}" if pool.get("version") else "")
             + f": {pool['threads']} threads" for pool in info.get("pools") or []]
    torch = info.get("torch")
    if torch:
        pools.append(f"torch: {torch['intra_op']} intra-op, {torch['inter_op']} inter-op threads")
    census = info.get("census") or {}
    busy = (f"; up to {census['max_threads_busy']:.1f} threads busy at once" if census.get("counts") else "") + (
        f" in {census['max_processes']} processes" if int(census.get("max_processes") or 1) > 1 else "")
    return (f"thread pools: {'; '.join(pools) or 'none loaded'}; {info['cpus']} usable CPUs, load "
            f"average {info['loadavg_1m']:.1f}{busy}")


def script_overhead_line(record: Mapping[str, Any]) -> str | None:
    """What profiling cost a script: cProfile's recorded calls times its cost per call, measured in the
    script's own process after it ended, against the script's wall time (an estimate: the script
    is not run twice)."""
    p = record["profile"]
    cost = ((p.get("evidence") or {}).get("profiler_cost") or {}).get("per_call_s")
    windows = (p.get("cprofile") or {}).get("windows") or {}
    calls = windows.get("recorded_calls", (p.get("cprofile") or {}).get("total_calls"))
    wall = float((record.get("script") or {}).get("wall_s") or 0.0)
    if cost is None or calls is None or wall <= 0:
        return None
    spent = min(calls * cost, 0.9 * wall)
    factor = wall / (wall - spent)
    how = "" if windows.get("whole", True) else (
        f"cProfile ran whole for the first {seconds_short(windows['whole_s'])}, then in {windows['windows']} windows "
        f"({seconds_short(windows['on_s'])} of the next {seconds_short(windows['on_s'] + windows['off_s'])}; the table "
        f"is those windows scaled ×{windows['scale']:.2f} to the whole run, callers restored from the stacks: "
        f"--cprofile-whole for more); ")
    imports = float(windows.get("imports_s") or 0.0)
    if imports >= 0.01:
        how += (f"cProfile paused for {seconds_short(imports)} of imports of installed packages (not your loop's "
                "work; not in the table); ")
    return (f"instrument overhead (estimated): {how}cProfile recorded {calls:,} calls at {cost * 1e6:.2g} µs each (calibrated "
            f"after the script), at least {seconds_short(spent)} of the script's {seconds_short(wall)}: ×{factor:.2f} "
            f"or more its time alone (Python-heavy library code such as SB3's pays up to twice that: BENCHMARKS.md); "
            f"the advisor's savings leave that cost out")


def _pyspy_and_gc_lines(console: Any, p: Mapping[str, Any], of: str) -> None:
    """Why py-spy was skipped (if it was), and the GC line: collections, time, share of ``of``, longest pause."""
    spy = p.get("py_spy")
    if spy and spy.get("skipped"):
        console.print(f"py-spy skipped: {spy['skipped']}", highlight=False, soft_wrap=True, markup=False)
    gc = p["gc"]
    n = gc["collections"]
    many = "collection" if gc["total_collections"] == 1 else "collections"
    console.print(f"gc: {gc['total_collections']:,} {many} (gen0 {n['gen0']:,}, gen1 {n['gen1']:,}, gen2 {n['gen2']:,}) "
                  f"took {gc['total_s']:.3f} s, {100 * gc['share_of_loop']:.1f}% of {of}; longest pause "
                  f"{gc['max_pause_ms']:.1f} ms", highlight=False, markup=False)


def _artifacts_and_findings(console: Any, record: Mapping[str, Any], p: Mapping[str, Any]) -> None:
    """Where the profile's files are, then the advisor's findings (or why there are none)."""
    run_dir = Path(record["run_dir"])
    for label, key in (("cProfile", "cprofile"), ("torch trace (Perfetto / chrome://tracing)", "torch_trace"),
                       ("py-spy flamegraph", "pyspy_svg"), ("py-spy speedscope", "pyspy_speedscope")):
        if key in p["artifacts"]:
            console.print(f"{label}: {run_dir / p['artifacts'][key]}", highlight=False, soft_wrap=True, markup=False)
    adv = p["advisor"]
    console.print(render_findings(adv["findings"], adv["measured_phase_s"], adv["none"]), soft_wrap=True)
