"""Planted: every step prints its rewards and logs the loss, reading device values on the host."""

import logging
import sys

import torch

from common import act, run

logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(message)s")
log = logging.getLogger("train")


def act_and_report(q, obs, epsilon):
    actions = act(q, obs, epsilon)
    print("actions", actions.tolist(), "obs", obs.mean(0).tolist())
    log.info("epsilon %.3f mean obs %.4f", epsilon, obs.mean().item())
    return actions


torch.set_num_threads(1)
run(act_fn=act_and_report, steps=150)
