"""train.update=graph (rlperf.graph_update): the torch update captured once and replayed as a CUDA graph.

Every test needs CUDA; on the CPU the form is refused in one line (tests/test_fused_update.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlperf.config import config_from
from rlperf.dqn import Agent
from test_fused_update import Fixed  # pytest puts tests/ on sys.path

pytestmark = [pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
OBS = 14
CUDA = torch.device("cuda")


def source(n: int = 4096, batch: int = 128, seed: int = 0) -> Fixed:
    g = torch.Generator().manual_seed(seed)
    data = (torch.randn(n, OBS, generator=g), torch.randint(0, 3, (n,), generator=g), torch.randn(n, generator=g),
            torch.randn(n, OBS, generator=g), (torch.rand(n, generator=g) < 0.3).float())
    slots = [torch.randint(0, n, (batch,), generator=g) for _ in range(16)]
    return Fixed(tuple(d.to(CUDA) for d in data), [s.to(CUDA) for s in slots])


def pair(overrides: list[str]) -> tuple[Agent, Agent]:
    out = []
    for form in ("torch", "graph"):
        cfg = config_from(None, ["buffer.batch_size=128", f"train.update={form}", *overrides])
        torch.manual_seed(0)
        out.append(Agent(cfg, (OBS,), CUDA))
    assert out[0].update_form[0] == "torch" and out[1].update_form[0] == "graph", out[1].update_form
    return out[0], out[1]


@pytest.mark.parametrize("overrides", [[], ["agent.target_update=hard", "agent.target_every=7"],
                                       ["agent.grad_clip=0.5", "agent.double=false", "agent.huber=false"]])
def test_the_graph_update_equals_the_eager_update(overrides):
    eager, graph = pair(overrides)
    a, b = source(), source()
    for step in range(40):
        la, lb = float(eager.update(a)), float(graph.update(b))
        assert abs(la - lb) <= 1e-4 * max(1.0, abs(la)), f"loss differs at update {step}: {la} vs {lb}"
    # The same arithmetic in other kernels (foreach capturable Adam against fused Adam): rounding
    # differences grow over 40 steps; on an H200 the largest was 2.2e-4 after clipping at 0.5.
    for x, y in zip(list(eager.q.parameters()) + list(eager.target.parameters()),
                    list(graph.q.parameters()) + list(graph.target.parameters()), strict=True):
        torch.testing.assert_close(x, y, atol=2e-3, rtol=1e-3)
    assert graph._graph is not None and graph._graph.captures == 1


def test_a_replayed_update_does_not_sync_and_selection_replays_too():
    _, graph = pair([])
    b = source()
    for _ in range(3):
        graph.update(b)
    obs = torch.randn(512, OBS, device=CUDA)
    graph.act(obs, 0.0), graph.act(obs, 0.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(10):
            graph.update(b)
            actions = graph.act(obs, 0.0)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    with torch.no_grad():
        assert torch.equal(actions, graph.q(obs).argmax(1))
    assert graph._select_graph is not None and graph._select_graph.captures == 1
    other = torch.randn(3, OBS, device=CUDA)  # another shape: eager, not the captured graph
    assert graph.act(other, 0.0).shape == (3,)


def test_a_resumed_graph_update_recaptures_and_continues_exactly_as_eager():
    eager, graph = pair([])
    a, b = source(), source()
    for _ in range(10):
        eager.update(a), graph.update(b)
    saved = graph.state_dict()
    graph.load_state_dict(saved)  # replaces the optimizer's state tensors: the graph must be dropped
    for _ in range(10):
        la, lb = float(eager.update(a)), float(graph.update(b))
        assert abs(la - lb) <= 1e-4 * max(1.0, abs(la))
    assert graph._graph is not None and graph._graph.captures == 2


def test_rlperf_train_on_cuda_takes_the_graph_update_and_says_so(tmp_path: Path):
    proc = subprocess.run([sys.executable, "-m", "rlperf", "train", "--config", "smoke", "--device", "cuda", "--out",
                           str(tmp_path), "--json"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads(next(tmp_path.rglob("run.json")).read_text())
    assert record["update"]["form"] == "graph" and "CUDA graph" in record["update"]["reason"]
    assert record["env"]["kernel"] == "fused" and "CUDA" in record["env"]["reason"]
