"""What a run imports before its first step: torch's compiler stack only where it is used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = """
import sys
import torch
from rlperf.config import config_from
from rlperf.dqn import Agent

for form in ("fused", "torch"):
    agent = Agent(config_from("smoke", [f"train.update={form}"]), (14,), torch.device("cpu"))
    agent.optimizer.zero_grad()
    agent.load_state_dict(agent.state_dict())
assert "torch._dynamo" not in sys.modules, "building and saving the agent imported torch._dynamo"

import torch._dynamo  # as train.compile does: from now on torch's own mark, built on the next call
from torch.optim import Optimizer
agent.optimizer.zero_grad()
mark = getattr(Optimizer.zero_grad.__wrapped__, "__dynamo_disable")
assert mark.__module__.startswith("torch._dynamo"), mark
print("ok")
"""


def test_an_agent_is_built_and_saved_without_torch_dynamo():
    """torch.optim marks Optimizer's methods for torch.compile by importing torch._dynamo (over a
    second of start-up) on their first call; rlperf defers that until something imports it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
