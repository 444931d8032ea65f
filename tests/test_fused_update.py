"""train.update: the fused update (rlperf/fused_update.py) against its torch reference (Agent's eager update).

Tolerances (float32; the forms sum in different orders -- BLAS through numba vs torch's kernels --
so they agree to rounding, not bit for bit):
- one update: the loss to 1e-6 relative, every parameter, target weight and Adam moment to 1e-5
  absolute (the weights are O(0.1); one Adam step moves a weight by about lr = 1e-3);
- 1,000 updates of [32] (200 of [64, 64] and 50 of [256, 256], to keep CI fast): parameters to
  2e-3 absolute. Rounding differences feed back through Adam's normalised steps, so they grow
  with the number of updates; 2e-3 is still two orders below the weights' own size and far below
  what one wrong term (a missed terminal, an off-by-one bias correction) produces within a few updates.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlperf.buffer import Batch, ReplayBuffer
from rlperf.config import config_from
from rlperf.dqn import Agent
from rlperf.errors import ConfigError
from rlperf.fused_update import compile_update, resolve_update

OBS = 14
CPU = torch.device("cpu")


class Fixed:
    """A BatchSource that hands over the transitions at injected slots of a stored set."""

    def __init__(self, data: tuple[torch.Tensor, ...], slots: list[torch.Tensor]) -> None:
        self.data, self.slots, self.calls = data, slots, 0

    def sample(self, batch_size: int) -> Batch:
        idx = self.slots[self.calls % len(self.slots)]
        self.calls += 1
        assert len(idx) == batch_size
        return Batch(*(f.index_select(0, idx) for f in self.data))


def transitions(n: int, seed: int, terminal: float = 0.3) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, OBS, generator=g)
    return (obs, torch.randint(0, 3, (n,), generator=g), torch.randn(n, generator=g) * 3,
            torch.randn(n, OBS, generator=g), (torch.rand(n, generator=g) < terminal).float())


def agents(form_overrides: list[str], hidden: list[int], batch: int) -> tuple[Agent, Agent]:
    pair = []
    for form in ("torch", "fused"):
        cfg = config_from(None, [f"agent.hidden=[{','.join(map(str, hidden))}]", f"buffer.batch_size={batch}",
                                 f"train.update={form}", *form_overrides])
        torch.manual_seed(0)
        pair.append(Agent(cfg, (OBS,), CPU))
    assert pair[0].update_form[0] == "torch" and pair[1].update_form[0] == "fused"
    return pair[0], pair[1]


def states(agent: Agent) -> list[torch.Tensor]:
    opt = agent.optimizer.state_dict()["state"]
    return ([p.detach() for p in agent.q.parameters()] + [p.detach() for p in agent.target.parameters()]
            + [opt[i][k] for i in sorted(opt) for k in ("exp_avg", "exp_avg_sq", "step")])


def assert_close(a: Agent, b: Agent, atol: float) -> None:
    for x, y in zip(states(a), states(b), strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=0)


CASES = [
    pytest.param([], id="double-huber-clip-soft"),
    pytest.param(["agent.double=false"], id="plain-target"),
    pytest.param(["agent.huber=false"], id="mse"),
    pytest.param(["agent.grad_clip=0"], id="no-clip"),
    pytest.param(["agent.grad_clip=0.05"], id="clip-active"),
    pytest.param(["agent.target_update=hard", "agent.target_every=3"], id="hard-target"),
    pytest.param(["agent.tau=0.7"], id="tau-above-half"),
]


@pytest.mark.parametrize("overrides", CASES)
@pytest.mark.parametrize("hidden", [[32], [64, 64], [256, 256]], ids=["32", "64x64", "256x256"])
def test_one_update_matches_torch(overrides: list[str], hidden: list[int]) -> None:
    data = transitions(512, seed=1)
    slots = [torch.randint(0, 512, (64,), generator=torch.Generator().manual_seed(k)) for k in range(4)]
    assert any(data[4][s].sum() > 0 for s in slots)  # terminal transitions in the batches
    ref, fused = agents(overrides, hidden, 64)
    # Four updates: the hard copy at 3, the bias corrections past their first step.
    for _ in range(4):
        loss_ref, loss_fused = float(ref.update(Fixed(data, slots))), float(fused.update(Fixed(data, slots)))
        assert loss_fused == pytest.approx(loss_ref, rel=1e-6)
    assert_close(ref, fused, atol=1e-5)
    assert ref.updates == fused.updates == 4


def test_clipping_is_exercised_both_ways() -> None:
    """The clip cases above mean something: the gradient norm of these batches is above 0.05 and below 10."""
    data = transitions(512, seed=1)
    cfg = config_from(None, ["agent.hidden=[32]", "buffer.batch_size=64", "train.update=torch"])
    agent = Agent(cfg, (OBS,), CPU)
    b = Fixed(data, [torch.arange(64)]).sample(64)
    q = agent.q(b.obs).gather(1, b.actions.unsqueeze(1)).squeeze(1)
    y = b.rewards + 0.99 * (1 - b.dones) * agent.target(b.next_obs).max(1).values
    torch.nn.functional.smooth_l1_loss(q, y.detach()).backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in agent.q.parameters()])
    assert 0.05 < float(norm) < 10


@pytest.mark.parametrize(("hidden", "updates", "overrides"), [
    ([32], 1000, []),
    ([32], 1000, ["agent.double=false", "agent.target_update=hard", "agent.target_every=50", "agent.grad_clip=0.5"]),
    ([64, 64], 200, []),
    ([256, 256], 50, []),
])
def test_many_updates_stay_close(hidden: list[int], updates: int, overrides: list[str]) -> None:
    data = transitions(2048, seed=2)
    g = torch.Generator().manual_seed(3)
    slots = [torch.randint(0, 2048, (32,), generator=g) for _ in range(updates)]
    ref, fused = agents(overrides, hidden, 32)
    src_ref, src_fused = Fixed(data, slots), Fixed(data, slots)
    for _ in range(updates):
        ref.update(src_ref)
        fused.update(src_fused)
    for x, y in zip(list(ref.q.parameters()) + list(ref.target.parameters()),
                    list(fused.q.parameters()) + list(fused.target.parameters()), strict=True):
        torch.testing.assert_close(x.detach(), y.detach(), atol=2e-3, rtol=0)
    step = ref.optimizer.state_dict()["state"][0]["step"]
    assert float(step) == float(fused.optimizer.state_dict()["state"][0]["step"]) == updates


def filled_buffer(seed: int) -> ReplayBuffer:
    buf = ReplayBuffer(4096, (OBS,), CPU, seed=seed)
    buf.push(*transitions(3000, seed=4))
    return buf


def test_in_kernel_gather_samples_what_the_buffer_samples() -> None:
    """From the tensor storage the fused form draws its slots with the buffer's own generator and
    gathers in the kernel: the same transitions as ``sample``, so the two forms stay together."""
    ref, fused = agents([], [64, 64], 128)
    buf_ref, buf_fused = filled_buffer(7), filled_buffer(7)
    for _ in range(20):
        torch.testing.assert_close(float(fused.update(buf_fused)), float(ref.update(buf_ref)), rtol=1e-5, atol=1e-6)
    assert_close(ref, fused, atol=1e-4)
    assert torch.equal(buf_ref.state_dict()["rng"]["state"], buf_fused.state_dict()["rng"]["state"])


def test_act_sees_the_fused_weights() -> None:
    _, fused = agents([], [32], 64)
    before = fused.q(torch.ones(1, OBS)).detach().clone()
    fused.update(filled_buffer(1))
    assert not torch.equal(before, fused.q(torch.ones(1, OBS)))  # same tensors, updated in place


@pytest.mark.parametrize("hidden", [[32], [64, 64]])
def test_fused_select_matches_torch_select(hidden: list[int]) -> None:
    """Same weights, same generator state: the same ε-greedy actions (greedy ones compared where the
    torch Q-values' best two differ by more than float32 rounding), and the generator left in the same state."""
    ref, fused = agents([], hidden, 64)
    obs = torch.randn(256, OBS, generator=torch.Generator().manual_seed(5))
    q = ref.q(obs).detach()
    top2 = q.topk(2, dim=1).values
    clear = (top2[:, 0] - top2[:, 1]) > 1e-4
    for epsilon in (0.0, 0.3, 1.0):
        a_ref, a_fused = ref.act(obs, epsilon), fused.act(obs, epsilon)
        assert a_fused.dtype == torch.int64 and a_fused.shape == (256,)
        assert torch.equal(a_ref[clear], a_fused[clear])
        assert torch.equal(ref.generator.get_state(), fused.generator.get_state())
    assert clear.float().mean() > 0.9
    torch_select = config_from(None, ["agent.hidden=[32]", "train.update=fused", "agent.inference=grad"])
    assert not Agent(torch_select, (OBS,), CPU)._fused_select  # inference=grad keeps its own (slow) form


@pytest.mark.parametrize(("saved", "resumed"), [("fused", "fused"), ("torch", "fused"), ("fused", "torch")])
def test_checkpoint_resumes_under_either_form(saved: str, resumed: str, tmp_path: Path) -> None:
    """The Adam moments and step live in the torch optimizer's state: a run saved under one form
    resumes exactly under the same form, and within float tolerance under the other."""
    cfgs = {form: config_from(None, ["agent.hidden=[64,64]", "buffer.batch_size=64", f"train.update={form}"])
            for form in ("torch", "fused")}
    torch.manual_seed(0)
    first = Agent(cfgs[saved], (OBS,), CPU)
    buf = filled_buffer(3)
    for _ in range(30):
        first.update(buf)
    torch.save({"agent": first.state_dict(), "buffer": buf.state_dict()}, tmp_path / "ckpt.pt")
    for _ in range(30):  # the uninterrupted run
        first.update(buf)

    def load() -> dict:  # afresh each time: the optimizer adopts the loaded tensors and updates them in place
        return torch.load(tmp_path / "ckpt.pt", weights_only=True)

    second = Agent(cfgs[resumed], (OBS,), CPU)
    buf2 = ReplayBuffer(4096, (OBS,), CPU, seed=99)
    buf2.load_state_dict(load()["buffer"])
    second.load_state_dict(load()["agent"])
    second.update(buf2)  # the first update builds the fused views
    state = load()
    second.load_state_dict(state["agent"])  # and loading again re-points them at the new state tensors
    buf2.load_state_dict(state["buffer"])
    for _ in range(30):
        second.update(buf2)
    assert_close(first, second, atol=0 if saved == resumed else 1e-4)


def test_resolve_update_forms_and_reasons() -> None:
    assert resolve_update(config_from(None, ["train.update=torch"]), CPU)[0] == "torch"
    form, reason = resolve_update(config_from(None, []), CPU)
    assert form == "fused" and reason.startswith("auto:")
    for override, words in (("train.compile=jit", "train.compile=jit"), ("train.grad_accum=2", "grad_accum"),
                            ("train.amp=bf16", "train.amp=bf16"), ("env.obs=grid", "CNN")):
        form, reason = resolve_update(config_from(None, [override]), CPU)
        assert form == "torch" and reason.startswith("auto:") and words in reason
        with pytest.raises(ConfigError, match=r"train\.update=fused cannot run"):
            resolve_update(config_from(None, [override, "train.update=fused"]), CPU)
    form, reason = resolve_update(config_from(None, []), torch.device("cuda"))
    assert form == "graph" and reason.startswith("auto: a CUDA device")
    for override, words in (("train.amp=bf16", "train.amp=bf16"), ("train.grad_accum=2", "grad_accum"),
                            ("train.compile=default", "train.compile=default")):
        form, reason = resolve_update(config_from(None, [override]), torch.device("cuda"))
        assert form == "torch" and words in reason
        with pytest.raises(ConfigError, match=r"train\.update=graph cannot run"):
            resolve_update(config_from(None, [override, "train.update=graph"]), torch.device("cuda"))
    with pytest.raises(ConfigError, match=r"train\.update=graph cannot run: .*CUDA device"):
        resolve_update(config_from(None, ["train.update=graph"]), CPU)


def test_fused_that_cannot_run_is_one_line_and_exit_2(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "rlperf", "train", "--config", "smoke", "--set", "train.update=fused",
                           "--set", "train.grad_accum=2", "--out", str(tmp_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert "train.update=fused cannot run" in proc.stderr and "Traceback" not in proc.stderr
    assert not any(tmp_path.iterdir())


def test_advisor_names_the_fused_update_with_its_measured_saving() -> None:
    from rlperf.config import config_to_dict
    from rlperf.instruments.advisor import advise

    def rec(sets: list[str], form: str, device: str = "cpu", micro: dict | None = None) -> dict:
        cfg = config_from(None, sets)
        total = 10.0
        phases = {name: {"total_s": s, "share": s / total, "calls": 100, "mean_ms": 10 * s, "p50_ms": 9 * s,
                         "p95_ms": 20 * s} for name, s in dict(select=1.0, step=0.5, push=0.3, train=8.0, log=0.2).items()}
        return {"config": config_to_dict(cfg), "phases": phases, "update": {"form": form, "reason": "x"},
                "timing": {"mode": "cpu", "warmup_steps": 10, "warmup_s": 1.0, "measured_steps": 1000,
                           "measured_wall_s": 10.0, "measured_updates": 2000},
                "totals": {"vector_steps": 1010, "updates": 2000, "env_steps": 256 * 1010},
                "throughput": {"replay_ratio": 1.0, "updates_per_s": 200.0},
                "system": {"device": device, "device_name": "cpu", "torch_threads": 1},
                "profile": {"microbench": micro or {}}}

    micro = {"update": {"what": "gradient update", "slow": "train.update=torch", "fast": "train.update=fused",
                        "slow_s": 9e-4, "fast_s": 2e-4, "repeats": 7}}
    f = next(f for f in advise(rec(["train.update=torch"], "torch", micro=micro), None, None)
             if f.knob == "train.update=fused")
    assert f.est_saving_s == pytest.approx(8.0 * (1 - 2 / 9)) and "4 ms per update" in f.evidence
    assert f.reference == "docs/bottlenecks.md §20 (rlperf explain 20)"
    assert f.command and "micro-benchmarked here" in f.estimate
    for quiet in (rec([], "fused"), rec(["train.update=torch"], "torch", device="cuda"),
                  rec(["train.update=torch", "train.grad_accum=2"], "torch")):
        assert "train.update=fused" not in {f.knob for f in advise(quiet, None, None)}


def test_microbench_times_both_forms_of_the_update() -> None:
    from rlperf.instruments.microbench import BENCHES, run_benches

    cfg = config_from("smoke", ["train.update=torch"])
    record = {"update": {"form": "torch"}, "system": {"device": "cpu", "torch_threads": 1}}
    out = run_benches(cfg, CPU, record, tuple(b for b in BENCHES if b.name == "update"))
    assert out["update"]["slow"] == "train.update=torch" and out["update"]["fast"] == "train.update=fused"
    assert out["update"]["slow_s"] > 0 and out["update"]["fast_s"] > 0
    assert run_benches(cfg, CPU, {"update": {"form": "fused"}, "system": {}},
                       tuple(b for b in BENCHES if b.name == "update")) == {}


def final_scores(form: str, sets: list[str], steps: int | None, tmp_path: Path) -> list[float]:
    from rlperf.run.lifecycle import train_run

    scores = []
    for seed in range(3):
        cfg = config_from("default", [*sets, f"train.update={form}", f"run.seed={seed}", "train.checkpoint=false"],
                          **({"steps": steps} if steps else {}))
        record = train_run(cfg, out=tmp_path / f"{form}{seed}", quiet=True, dashboard=False).record
        assert record["status"] == "completed" and record["update"]["form"] == form
        scores.append(record["learning"]["mean_score_last_100"])
    return scores


def assert_same_learning(torch_scores: list[float], fused_scores: list[float], floor: float) -> None:
    """Means over the seeds within twice the standard error of their difference (at least ``floor`` points)."""
    import statistics

    se = (statistics.variance(torch_scores) / 3 + statistics.variance(fused_scores) / 3) ** 0.5
    diff = abs(statistics.mean(torch_scores) - statistics.mean(fused_scores))
    assert diff <= max(2 * se, floor), (torch_scores, fused_scores)


def test_both_forms_learn_alike_small(tmp_path: Path) -> None:
    """CI's version: the default config on 8×8 boards for 40k env steps, 3 seeds per form."""
    sets = ["env.size=8", "env.num_envs=64", "train.learning_starts=1000", "agent.eps_decay_steps=15000",
            "buffer.capacity=20000", "buffer.batch_size=64", "run.threads=1"]
    torch_scores, fused_scores = (final_scores(f, sets, 40_000, tmp_path) for f in ("torch", "fused"))
    assert min(torch_scores + fused_scores) > 1.0  # both learned (a random policy scores ~0.2 here)
    assert_same_learning(torch_scores, fused_scores, floor=1.0)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("RLPERF_LONG_TESTS"), reason="4–5 minutes on 2 cores: set RLPERF_LONG_TESTS=1 "
                    "(the CI-sized test_both_forms_learn_alike_small runs every time)")
def test_both_forms_learn_alike_default(tmp_path: Path) -> None:
    """The default config as shipped (5000 episodes), 3 seeds per form."""
    torch_scores, fused_scores = (final_scores(f, [], None, tmp_path) for f in ("torch", "fused"))
    assert_same_learning(torch_scores, fused_scores, floor=2.0)


def test_bench_update_quick() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_update.py"
    proc = subprocess.run([sys.executable, str(script), "--quick", "--part", "update", "--json"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    import json

    rows = json.loads(proc.stdout)["update"]
    assert [(r["network"], r["batch"]) for r in rows] == [("64x64", 128), ("256x256", 256)]
    assert all(r["torch_us"] > 0 and r["fused_us"] > 0 and isinstance(r["met"], bool) for r in rows)


def test_compiling_the_update_leaves_the_global_generator_alone() -> None:
    """The compile runs once per process (cached): a draw from the run's generator there would make a
    resumed run's RNG state differ from the uninterrupted run's, depending on what ran before it."""
    compile_update.cache_clear()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    _seconds, failure = compile_update(3)
    assert failure is None
    assert torch.equal(torch.get_rng_state(), before)
