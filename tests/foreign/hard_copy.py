"""Planted: the target network is copied with load_state_dict after every update."""

import torch

from common import run


def copy_target(q, target) -> None:
    target.load_state_dict(q.state_dict())


torch.set_num_threads(1)
run(target_fn=copy_target, width=256, steps=150)
