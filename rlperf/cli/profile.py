"""``rlperf profile``: a training run under instruments, and the advisor's reading of it
(library: :mod:`rlperf.instruments.profiling`; rendering: :mod:`rlperf.report.profile`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rlperf.cli.app import command, command_stop, rendering
from rlperf.cli.options import RunArgs, run_options
from rlperf.errors import RlperfError
from rlperf.instruments.windows import WHOLE_S

DEFAULT_EPISODES = 100


@command(context_settings={"allow_interspersed_args": False})
@run_options()
def profile(
    ctx: typer.Context,
    script: Annotated[list[str] | None, typer.Argument(
        metavar="[-- python SCRIPT [ARGS]...]", show_default=False,
        help="Profile your own script instead: -- python train.py ARGS, or -- python -m package.module ARGS.")] = None,
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also write TensorBoard scalars to RUN_DIR/tb.")] = False,
    top: Annotated[int, typer.Option("--top", help="Functions and ops to list.")] = 20,
    sort: Annotated[str, typer.Option("--sort", help="cProfile order: cumtime, tottime or ncalls.")] = "cumtime",
    cprofile: Annotated[bool, typer.Option("--cprofile/--no-cprofile", help="cProfile the loop; saves profile.prof.")] = True,
    cprofile_whole: Annotated[float | None, typer.Option(
        "--cprofile-whole", metavar="SECONDS", help=f"For a script: seconds profiled whole (default {WHOLE_S:g}), "
        "after which cProfile runs a tenth of the time, in short windows, and its table is scaled to the whole run "
        "(an estimate that costs less; inf: the whole run exact).", show_default=False)] = None,
    torch_: Annotated[bool, typer.Option("--torch", help="torch.profiler over a window of steps; saves trace.json.")] = False,
    py_spy: Annotated[bool, typer.Option(
        "--py-spy", help="Run under py-spy record; saves pyspy.svg and pyspy.speedscope.json.")] = False,
    native: Annotated[bool, typer.Option("--native", help="With --py-spy: also sample native (C/C++) frames.")] = False,
    verify: Annotated[int, typer.Option(
        "--verify", metavar="K", help="Run the top K findings' compare lines (3 interleaved repeats each) and print the "
        "measured gain beside each estimate; for a script, re-run it alone as it is and with each fix rlperf can "
        "apply from outside (threads, gc_pauses, autograd_forward).")] = 0,
    pyspy_child: Annotated[str | None, typer.Option(
        "--pyspy-child", hidden=True, help="Internal: run as the py-spy child, write the record here.")] = None,
    *,
    run: RunArgs,
) -> None:
    """Where does the time go, and what to do about it: a train run (100 episodes unless --episodes or
    --steps) under cProfile and optionally torch.profiler and py-spy, with the advisor's findings.

    rlperf profile [OPTIONS] -- python SCRIPT [ARGS] profiles your own script the same way: its phase
    table when it uses rlperf.PhaseTimer, its top functions with your code marked, and the advisor."""
    from rlperf.instruments.profilers import ProfileOptions

    options = ProfileOptions(top=top, sort=sort, cprofile=cprofile, torch=torch_,
                             cprofile_whole=WHOLE_S if cprofile_whole is None else cprofile_whole)
    _check_arguments(ctx, options, py_spy, native, verify, run, windows_given=cprofile_whole is not None)
    if script:
        _profile_script(ctx, script, options, py_spy, native, verify, tensorboard, run)

    _profile_own_loop(options, py_spy, native, verify, tensorboard, pyspy_child, run)


def _profile_own_loop(options: Any, py_spy: bool, native: bool, verify: int, tensorboard: bool,
                      pyspy_child: str | None, run: RunArgs) -> None:
    """``rlperf profile [OPTIONS]``: a train run of rlperf's own loop under the instruments; exits with its code."""
    # The imports that bring torch in come here, after the script's branch.
    from rlperf.instruments.advisor import VerifyBase
    from rlperf.instruments.profiling import check_runnable, profile_run, write_profiled_record
    from rlperf.run.lifecycle import exit_code

    if run.episodes is None and run.steps is None:
        run.episodes = DEFAULT_EPISODES
    cfg = run.build_config()
    if tensorboard:
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"tensorboard": True})})
    if cfg.run.mode == "async":
        raise RlperfError("rlperf profile instruments the single-process loop; run.mode=async is not supported",
                          hint="profile with --set run.mode=sync")
    run_args = run.run_argv()
    options.verify = VerifyBase(run.config or "default", tuple(run_args))
    argv = list(sys.argv)
    stop = command_stop()

    if pyspy_child:  # the py-spy child: run, and hand the record to the parent in a file
        _run_pyspy_child(cfg, pyspy_child, options, argv, run, stop)

    record: dict[str, Any] | None = None
    skipped: str | None = None
    if py_spy:
        check_runnable(cfg)  # what the child would refuse, refused once, here
        child_args = ([] if run.config is None else ["--config", run.config]) + run_args + [
            "--out", str(run.out), "--top", str(options.top), "--sort", options.sort]
        child_args += (["--name", run.name] if run.name else []) + ([] if options.cprofile else ["--no-cprofile"])
        child_args += (["--torch"] if options.torch else []) + (["--tensorboard"] if tensorboard else [])
        child_args += ["--quiet"] if (run.quiet or run.json_) else []
        record, skipped = _run_pyspy_parent(child_args, run.out, native, stop)
    if record is None:
        result = profile_run(cfg, out=run.out, name=run.name, command=argv, quiet=run.quiet or run.json_,
                             dashboard=not run.json_, options=options, stop=stop)
        record, code = result.record, result.exit_code
    else:
        code = exit_code(record.get("status", "failed"), stop.signum)
        if code == 0 and stop():  # the child's run completed; the signal cut its overhead replay short
            code = stop.exit_code
    record["command"] = argv
    record["profile"]["options"].update(py_spy=py_spy, native=native, verify=verify)
    if py_spy and skipped:
        record["profile"]["py_spy"] = {"skipped": skipped}
    code = _verify_top(record, cfg, verify, run, stop) or code
    write_profiled_record(record, Path(record["run_dir"]))
    _show_profile(record, run)
    raise typer.Exit(code)


def _show_profile(record: dict[str, Any], run: RunArgs) -> None:
    """The profile of rlperf's own loop: its tables (or the record as JSON), notes and figure."""
    from rlperf.cli.train import emit
    from rlperf.report.profile import notes, render_profile

    with rendering():
        if run.json_ or run.quiet:  # --quiet: the one line emit prints
            emit(record, run.json_, run.quiet)
        else:
            render_profile(record, run.quiet)
            for note in notes(record):
                print(f"rlperf: {note}", file=sys.stderr)
        if run.plot:
            from rlperf.cli.figures import draw_run

            draw_run(record, quiet=run.quiet)


def _check_arguments(ctx: typer.Context, options: Any, py_spy: bool, native: bool, verify: int, run: RunArgs,
                     windows_given: bool = False) -> None:
    """What is refused before anything runs, whichever loop is profiled."""
    options.check()
    if native and not py_spy:
        raise RlperfError("--native applies to --py-spy", hint="add --py-spy")
    if verify < 0:
        raise RlperfError(f"--verify must be 0 or more, got {verify}")
    if windows_given and ctx.meta.get("rlperf.after_dashdash") is None:
        raise RlperfError("--cprofile-whole applies to a script's profile", hint="rlperf profile --cprofile-whole 5 -- "
                          "python train.py")
    from rlperf.run.files import check_run_name

    check_run_name(run.name)
    if ctx.meta.get("rlperf.after_dashdash") == []:  # "--" and nothing after it: not the default config
        raise RlperfError("nothing to run after --", hint="write: rlperf profile [OPTIONS] -- python SCRIPT [ARGS...], "
                          "or leave out -- to profile rlperf's own loop")

def _run_pyspy_child(cfg: Any, record_path: str, options: Any, argv: list[str], run: RunArgs, stop: Any) -> None:
    """The py-spy child: run under the instruments and hand the record to the parent in a file."""
    from rlperf.instruments.profiling import child_failed, profile_run, stop_with_parent
    from rlperf.atomic import write_json_atomic

    stop_with_parent()
    try:
        result = profile_run(cfg, out=run.out, name=run.name, command=argv, quiet=run.quiet,
                             dashboard=not run.quiet, options=options, stop=stop)
        write_json_atomic(record_path, result.record)
    except RlperfError as exc:
        child_failed(record_path, exc.exit_code)
        raise
    raise typer.Exit(result.exit_code)


def _run_pyspy_parent(child_args: list[str], out: Any, native: bool, stop: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The run as a child under py-spy: its record (None: run it in-process) and why py-spy was skipped."""
    from rlperf.instruments.profiling import profile_under_pyspy

    stop.arm()
    ran, skipped = profile_under_pyspy(child_args, out, native, stop)
    if ran is not None and ran.child_exit is not None:  # the child failed on its own and said why
        raise typer.Exit(ran.child_exit)
    if skipped:
        with rendering():
            print(f"rlperf: py-spy skipped: {skipped}", file=sys.stderr)
    return (ran.record if ran is not None else None), skipped


def _verify_top(record: dict[str, Any], cfg: Any, verify: int, run: RunArgs, stop: Any) -> int:
    """``--verify K`` after a completed run: the findings gain their measured gains; the exit code a
    signal during it sets (0: none)."""
    if not verify or record["status"] != "completed" or stop():
        return 0
    record["profile"]["verify"] = _verify(record, cfg, verify, run, stop)
    return stop.exit_code if stop() else 0


def _verify(record: dict[str, Any], cfg: Any, k: int, run: RunArgs, stop: Any) -> dict[str, Any]:
    """``--verify K``: the top K findings' compare lines, with a progress bar unless quiet."""
    import contextlib

    from rlperf.instruments.profiling import VERIFY_REPEATS, verify_findings
    from rlperf.report.dashboard import RunsProgress

    with_knob = [f for f in record["profile"]["advisor"]["findings"] if f.get("knob")][:k]
    total = (len(with_knob) + 1) * VERIFY_REPEATS if with_knob else 0
    progress = None if run.quiet or run.json_ or not total else RunsProgress("verify", total)

    with progress or contextlib.nullcontext():
        return verify_findings(record, cfg, k, out=run.out, on_run=progress.on_run if progress else None, stop=stop)


def _import_meanwhile(plot: bool) -> None:
    """While the script runs (rlperf only waits then, and a second CPU is free): the report's imports,
    and matplotlib's for the figure (half a second less after the script ends)."""
    from rlperf.instruments.script import import_meanwhile as load

    load("rlperf.report.profile", *(("rlperf.report.plots", "matplotlib.backends.backend_agg", "matplotlib.figure")
                                    if plot else ()))


def _verify_script(target: Any, record: dict[str, Any], k: int, run: RunArgs) -> None:
    """``--verify K`` after a script's profile: its top findings re-measured, the record rewritten."""
    from rlperf.atomic import write_json_atomic
    from rlperf.instruments.script_verify import VERIFY_REPEATS, verify_script

    if not (run.quiet or run.json_):
        print(f"verifying the top {k} finding(s): the script alone, as it is and with each fix rlperf can apply, "
              f"{VERIFY_REPEATS} interleaved runs each (its output not shown)", file=sys.stderr)
    record["profile"]["verify"] = verify_script(target, record, k)
    write_json_atomic(Path(record["run_dir"]) / "run.json", record)


def _profile_script(ctx: typer.Context, script: list[str], options: Any, py_spy: bool, native: bool, verify: int,
                    tensorboard: bool, run: RunArgs) -> None:
    """``rlperf profile [OPTIONS] -- python SCRIPT [ARGS]``: your script under the instruments; exits with its code."""
    from rlperf.instruments.script import parse_script_command, profile_script

    if ctx.meta.get("rlperf.after_dashdash") != script:
        raise RlperfError(f"unexpected argument {script[0]!r}", hint="put your command after --: rlperf profile -- "
                          "python train.py")
    ignored = [flag for flag, on in (("--config", run.config is not None), ("--set and the run flags", run.given),
                                     ("--tensorboard", tensorboard)) if on]
    if ignored:
        raise RlperfError(f"{ignored[0]} applies to rlperf's own loop, not to a script",
                          hint="set your script's options after --")
    target = parse_script_command(script)
    drawn: list[tuple[dict[str, Any], Path | None]] = []  # (the record it was drawn from, the figure)

    def ready(record: dict[str, Any]) -> None:  # while the script's process ends: its figure, off the critical path
        if run.plot and not verify:
            from rlperf.cli.figures import draw_run

            drawn.append((record, draw_run(record, quiet=True)))

    result = profile_script(target, out=run.out, name=run.name, options=options, py_spy=py_spy, native=native,
                            quiet_stdout=run.json_, command=list(sys.argv), meanwhile=lambda: _import_meanwhile(run.plot),
                            ready=ready)
    if verify and result.exit_code == 0 and result.record["profile"]["advisor"]["findings"]:
        _verify_script(target, result.record, verify, run)
    if run.json_:
        sys.stdout.write(json.dumps(result.record, indent=2, default=str) + "\n")
    elif run.quiet:
        from rlperf.report.tables import quiet_line

        sys.stdout.write(quiet_line(result.record) + "\n")
    else:
        from rlperf.report.profile import render_script_profile

        render_script_profile(result.record, run.quiet)
    if result.record["script"]["ended"]:
        print(f"rlperf: the script was {result.record['script']['ended']}", file=sys.stderr)
    if run.plot:
        from rlperf.cli.figures import announce, draw_run

        if drawn and drawn[0][0] is result.record:  # drawn from this very record while the script's process ended
            announce(drawn[0][1], run.quiet)
        else:
            draw_run(result.record, quiet=run.quiet)
    raise typer.Exit(result.exit_code)
