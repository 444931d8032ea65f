"""Planted: 16 gradient updates per env step."""

import torch

from common import run

torch.set_num_threads(1)
run(updates_per_step=16, steps=120)
