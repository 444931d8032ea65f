"""Planted: actions are selected with autograd on (no torch.no_grad / inference_mode)."""

import torch

from common import run


def act_with_grad(q, obs, epsilon):
    greedy = q(obs).argmax(1)
    explore = torch.rand(obs.shape[0]) < epsilon
    return torch.where(explore, torch.randint(0, 2, (obs.shape[0],)), greedy)


torch.set_num_threads(1)
run(act_fn=act_with_grad, envs=512, width=256, steps=150)
