"""The greedy Snake heuristic the default config must beat.

Move toward the fruit and never into immediate death: among the three relative moves, take a
safe one that brings the head closer to the fruit (straight first on ties), else any safe move,
else straight. It reads only the first 11 observation features, so it runs batched on any device.
"""

from __future__ import annotations

import torch

# Absolute heading after each relative move, for each current heading (rows: up, right, down, left).
_AFTER_MOVE = torch.tensor([[0, 1, 3], [1, 2, 0], [2, 3, 1], [3, 0, 2]])
# Feature index of "fruit is that way" for each absolute direction: up, right, down, left.
_FRUIT_FEATURE = torch.tensor([9, 8, 10, 7])


def greedy_actions(obs: torch.Tensor) -> torch.Tensor:
    """Heuristic actions for a batch of ``features`` observations ``(N, >=11)``."""
    heading = obs[:, 3:7].argmax(1)
    moves = _AFTER_MOVE.to(obs.device)[heading]  # (N, 3) absolute direction of each relative move
    toward = obs.gather(1, _FRUIT_FEATURE.to(obs.device)[moves]) > 0.5
    safe = obs[:, 0:3] < 0.5
    # Score: safe and toward 3, safe 2, deadly 0; earlier (straight) wins ties via argmax.
    score = safe.float() * 2 + (safe & toward).float()
    return score.argmax(1)


@torch.no_grad()
def evaluate_heuristic(size: int = 10, num_envs: int = 256, episodes: int = 1000, seed: int = 0,
                       device: str = "cpu") -> dict[str, float]:
    """Play ``episodes`` episodes with the heuristic; mean/max score and mean length."""
    from rlperf.env.vector import VectorSnake

    env = VectorSnake(num_envs=num_envs, size=size, device=device, copy=False)
    obs, _ = env.reset(seed=seed)
    scores: list[int] = []
    lengths: list[int] = []
    while len(scores) < episodes:
        obs, _, _, _, infos = env.step(greedy_actions(obs))
        done = infos["_final_info"]
        if done.any():
            scores += infos["final_info"]["score"][done].tolist()
            lengths += infos["final_info"]["steps"][done].tolist()
    scores, lengths = scores[:episodes], lengths[:episodes]
    return {"episodes": len(scores), "mean_score": sum(scores) / len(scores), "max_score": max(scores),
            "mean_length": sum(lengths) / len(lengths)}
