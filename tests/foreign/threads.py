"""Planted: 8 torch threads on however few CPUs the machine has, on a network big enough to use them."""

import torch

from common import run

torch.set_num_threads(8)
run(width=512, batch=256, steps=150)
