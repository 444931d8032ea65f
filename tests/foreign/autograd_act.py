"""Planted: actions are selected with autograd on (no torch.no_grad / inference_mode)."""

import torch

from common import run


scorer = torch.nn.TransformerEncoder(
    torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=32, batch_first=True), num_layers=3)


def act_with_grad(q, obs, epsilon):
    context = scorer(obs.unsqueeze(1)).squeeze(1)  # attention over the observation, with autograd on
    greedy = q(context).argmax(1)
    explore = torch.rand(obs.shape[0]) < epsilon
    return torch.where(explore, torch.randint(0, 2, (obs.shape[0],)), greedy)


torch.set_num_threads(1)
run(act_fn=act_with_grad, envs=16, width=64, steps=300)
