"""``rlperf profile``: a training run under instruments, and the advisor's reading of it
(library: :mod:`rlperf.instruments.profiling`; rendering: :mod:`rlperf.report.profile`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from rlperf.cli.app import command, command_stop, rendering
from rlperf.cli.options import RunArgs, run_options
from rlperf.errors import RlperfError

DEFAULT_EPISODES = 100


@command()
@run_options()
def profile(
    tensorboard: Annotated[bool, typer.Option("--tensorboard", help="Also write TensorBoard scalars to RUN_DIR/tb.")] = False,
    top: Annotated[int, typer.Option("--top", help="Functions and ops to list.")] = 20,
    sort: Annotated[str, typer.Option("--sort", help="cProfile order: cumtime, tottime or ncalls.")] = "cumtime",
    cprofile: Annotated[bool, typer.Option("--cprofile/--no-cprofile", help="cProfile the loop; saves profile.prof.")] = True,
    torch_: Annotated[bool, typer.Option("--torch", help="torch.profiler over a window of steps; saves trace.json.")] = False,
    py_spy: Annotated[bool, typer.Option(
        "--py-spy", help="Run under py-spy record; saves pyspy.svg and pyspy.speedscope.json.")] = False,
    native: Annotated[bool, typer.Option("--native", help="With --py-spy: also sample native (C/C++) frames.")] = False,
    pyspy_child: Annotated[str | None, typer.Option(
        "--pyspy-child", hidden=True, help="Internal: run as the py-spy child, write the record here.")] = None,
    *,
    run: RunArgs,
) -> None:
    """Where does the time go, and what to do about it: a train run (100 episodes unless --episodes or
    --steps) under cProfile and optionally torch.profiler and py-spy, with the advisor's findings."""
    from rlperf.cli.train import emit
    from rlperf.instruments.advisor import VerifyBase
    from rlperf.instruments.profiling import (
        ProfileOptions, check_runnable, child_failed, profile_run, profile_under_pyspy, stop_with_parent,
        write_profiled_record,
    )
    from rlperf.report.profile import notes, render_profile
    from rlperf.run.files import check_run_name, write_json_atomic
    from rlperf.run.lifecycle import exit_code

    options = ProfileOptions(top=top, sort=sort, cprofile=cprofile, torch=torch_)
    options.check()
    if native and not py_spy:
        raise RlperfError("--native applies to --py-spy", hint="add --py-spy")
    check_run_name(run.name)
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
        stop_with_parent()
        try:
            result = profile_run(cfg, out=run.out, name=run.name, command=argv, quiet=run.quiet,
                                 dashboard=not run.quiet, options=options, stop=stop)
            write_json_atomic(pyspy_child, result.record)
        except RlperfError as exc:
            child_failed(pyspy_child, exc.exit_code)
            raise
        raise typer.Exit(result.exit_code)

    record: dict[str, Any] | None = None
    skipped: str | None = None
    if py_spy:
        check_runnable(cfg)  # what the child would refuse, refused once, here
        child_args = ([] if run.config is None else ["--config", run.config]) + run_args + [
            "--out", str(run.out), "--top", str(top), "--sort", options.sort]
        child_args += (["--name", run.name] if run.name else []) + ([] if cprofile else ["--no-cprofile"])
        child_args += (["--torch"] if torch_ else []) + (["--tensorboard"] if tensorboard else [])
        child_args += ["--quiet"] if (run.quiet or run.json_) else []
        stop.arm()
        ran, skipped = profile_under_pyspy(child_args, run.out, native, stop)
        if ran is not None and ran.child_exit is not None:  # the child failed on its own and said why
            raise typer.Exit(ran.child_exit)
        record = ran.record if ran is not None else None
        if skipped:
            with rendering():
                print(f"rlperf: py-spy skipped: {skipped}", file=sys.stderr)
    if record is None:
        result = profile_run(cfg, out=run.out, name=run.name, command=argv, quiet=run.quiet or run.json_,
                             dashboard=not run.json_, options=options, stop=stop)
        record, code = result.record, result.exit_code
    else:
        code = exit_code(record.get("status", "failed"), stop.signum)
        if code == 0 and stop():  # the child's run completed; the signal cut its overhead replay short
            code = stop.exit_code
    record["command"] = argv
    record["profile"]["options"].update(py_spy=py_spy, native=native)
    if py_spy and skipped:
        record["profile"]["py_spy"] = {"skipped": skipped}
    write_profiled_record(record, Path(record["run_dir"]))

    with rendering():
        if run.json_:
            emit(record, True, run.quiet)
        else:
            render_profile(record, run.quiet)
        for note in notes(record):
            print(f"rlperf: {note}", file=sys.stderr)
    raise typer.Exit(code)
