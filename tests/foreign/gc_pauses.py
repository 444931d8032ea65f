"""Planted: every step keeps thousands of new container objects (a list-of-tuples history) and makes
reference cycles, so the collector scans a growing heap again and again."""

import torch

from common import run

history: list = []


def act_and_remember(q, obs, epsilon):
    from common import act

    actions = act(q, obs, epsilon)
    for row in obs.tolist():
        node = {"obs": row, "next": None}
        node["next"] = node  # a cycle per row
        history.append((row, [node]))
    return actions


torch.set_num_threads(1)
run(act_fn=act_and_remember, envs=256, steps=200)
