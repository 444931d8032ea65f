"""Actor/learner with multiprocessing: one actor process collects chunks of experience with the
latest weights (shared memory), the learner (main process) trains on each chunk and publishes.

Planted (busy_wait): both sides wait by polling with a sleep -- the learner for the next chunk
(``while queue.empty(): time.sleep``), the actor for new weights (``while version.value == seen``).
``--fixed`` blocks on the queue and on an event instead.
"""
import argparse
import multiprocessing as mp
import time

import numpy as np
import torch
from torch import nn

CHUNK = 32
POLL_S = 0.02


def make_policy():
    return nn.Sequential(nn.Linear(8, 64), nn.Tanh(), nn.Linear(64, 4))


def actor(shared_params, version, weights_ready, chunks, iterations, fixed):
    torch.set_num_threads(1)
    policy = make_policy()
    rng = np.random.default_rng(1)
    state = rng.standard_normal(8).astype(np.float32)
    seen = -1
    for _ in range(iterations):
        if fixed:
            weights_ready.wait()
            weights_ready.clear()
        else:
            while version.value == seen:
                time.sleep(POLL_S)  # planted: busy_wait
        seen = version.value
        torch.nn.utils.vector_to_parameters(shared_params, policy.parameters())
        obs = np.zeros((CHUNK, 8), np.float32)
        actions = np.zeros(CHUNK, np.int64)
        rewards = np.zeros(CHUNK, np.float32)
        for t in range(CHUNK):
            obs[t] = state
            with torch.no_grad():
                actions[t] = int(torch.argmax(policy(torch.from_numpy(state))))
            state = np.tanh(state + 0.1 * np.roll(state, actions[t]) + 0.05 * rng.standard_normal(8)).astype(np.float32)
            rewards[t] = -float(np.abs(state).sum())
        chunks.put((obs, actions, rewards))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    iterations = max(1, int(args.iterations * args.scale))
    policy = make_policy()
    opt = torch.optim.Adam(policy.parameters(), lr=1e-3)
    shared_params = torch.nn.utils.parameters_to_vector(policy.parameters()).detach().share_memory_()
    version = mp.Value("i", 0)
    weights_ready = mp.Event()
    weights_ready.set()
    chunks = mp.Queue()
    proc = mp.Process(target=actor, args=(shared_params, version, weights_ready, chunks, iterations, args.fixed))
    proc.start()
    for it in range(iterations):
        if args.fixed:
            obs, actions, rewards = chunks.get()
        else:
            while chunks.empty():
                time.sleep(POLL_S)  # planted: busy_wait
            obs, actions, rewards = chunks.get_nowait()
        obs_t, act_t = torch.from_numpy(obs), torch.from_numpy(actions)
        ret = torch.from_numpy(rewards).flip(0).cumsum(0).flip(0)
        adv = (ret - ret.mean()) / (ret.std() + 1e-6)
        for _ in range(4):
            logp = torch.log_softmax(policy(obs_t), 1).gather(1, act_t[:, None]).squeeze(1)
            loss = -(logp * adv).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        shared_params.copy_(torch.nn.utils.parameters_to_vector(policy.parameters()).detach())
        with version.get_lock():
            version.value = it + 1
        weights_ready.set()
    proc.join()
    print(f"{iterations} chunks learned, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
