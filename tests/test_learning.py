"""The DQN learns: a short CPU run clearly beats a random policy, and the heuristic is sound."""

from __future__ import annotations

import pytest
import torch

from rlperf.config import config_from
from rlperf.env.heuristic import evaluate_heuristic, greedy_actions
from rlperf.run.lifecycle import train_run
from rlperf.env.vector import VectorSnake


def random_policy_score(size: int, episodes: int = 400) -> float:
    env = VectorSnake(num_envs=64, size=size, device="cpu")
    env.reset(seed=123)
    gen = torch.Generator().manual_seed(0)
    scores: list[int] = []
    while len(scores) < episodes:
        _, _, _, _, infos = env.step(torch.randint(0, 3, (64,), generator=gen))
        scores += infos["final_info"]["score"][infos["_final_info"]].tolist()
    return sum(scores) / len(scores)


def test_short_run_beats_a_random_policy(tmp_path) -> None:
    # 8x8 boards, 60k env steps: seconds on a CPU. A random policy scores ~0.2 here; a learner that
    # only avoids walls already doubles that, so ask for several times the random score.
    cfg = config_from("default", ["env.size=8", "env.num_envs=64", "train.learning_starts=1000", "agent.hidden=[64, 64]",
                                   "agent.lr=1e-3", "agent.eps_decay_steps=20000", "buffer.capacity=20000",
                                   "buffer.batch_size=64", "run.threads=1", "train.checkpoint=false"], steps=60_000)
    record = train_run(cfg, out=tmp_path, quiet=True, dashboard=False).record
    random_score = random_policy_score(8)
    learned = record["learning"]["mean_score_last_100"]
    assert record["status"] == "completed"
    assert learned > max(1.0, 4 * random_score), (learned, random_score)


def test_heuristic_avoids_immediate_death_and_chases_fruit() -> None:
    env = VectorSnake(num_envs=1, size=6, device="cpu")
    env.reset(seed=0)
    # Heading right along the top row, wall ahead, fruit below: turning right (down) is safe and toward it.
    env.set_board(0, [(0, 5), (0, 4), (0, 3)], direction=1, fruit=(4, 5))
    assert greedy_actions(env.observations).tolist() == [1]
    # Fruit straight ahead: go straight.
    env.set_board(0, [(2, 2), (2, 1), (2, 0)], direction=1, fruit=(2, 5))
    assert greedy_actions(env.observations).tolist() == [0]


def test_heuristic_scores_far_above_random() -> None:
    result = evaluate_heuristic(size=6, num_envs=64, episodes=200)
    assert result["mean_score"] > 5 * random_policy_score(6, episodes=200)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fast_hot_loop_has_no_host_sync_outside_the_log_phase(tmp_path, monkeypatch) -> None:
    """select/step/push/train never synchronise on CUDA in the fast configuration."""
    from rlperf import dqn

    cfg = config_from("fast", ["train.learning_starts=512", "train.log_every=50", "train.gc=on"], steps=256 * 40,
                      device="cuda")
    real_phase = dqn.PhaseTimer.phase

    def strict_phase(self, name):
        torch.cuda.set_sync_debug_mode(0 if name == "log" else "error")
        return real_phase(self, name)

    monkeypatch.setattr(dqn.PhaseTimer, "phase", strict_phase)
    try:
        record = train_run(cfg, out=tmp_path, quiet=True, dashboard=False).record
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert record["status"] == "completed"
