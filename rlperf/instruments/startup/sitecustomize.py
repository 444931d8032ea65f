"""Run at the start of each Python process that a script under ``rlperf profile`` starts (rlperf puts this
folder first on the script's PYTHONPATH): multiprocessing's ``spawn`` and ``forkserver`` workers,
which a fork's at-fork hook never reaches, are sampled like forked ones
(:func:`rlperf.instruments.evidence.sample_started_process`). Then the ``sitecustomize`` this one hides,
if there is one (a distribution's, a virtual environment's), runs as Python would have run it."""

import os
import sys


def _sample() -> None:
    if not os.environ.get("RLPERF_WORKER_SAMPLES"):  # evidence.WORKERS_ENV, read without importing rlperf
        return
    try:
        from rlperf.instruments import evidence
    except ImportError:  # a Python without rlperf
        return
    evidence.sample_started_process()


def _hidden() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


_sample()
_hidden()
