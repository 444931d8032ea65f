"""DQN on a small batched numpy gridworld (plain-function style)."""
import os
import time

import numpy as np
import torch
import torch.nn as nn

FIX = os.environ.get("FIX", "0") == "1"

GRID = 9
N_ENVS = 16
MAX_T = 60
MOVES = np.array([[0, 1], [0, -1], [1, 0], [-1, 0]])
WALLS = {(3, y) for y in range(0, 6)} | {(6, y) for y in range(3, 9)}
WALL_MASK = np.zeros((GRID, GRID), dtype=bool)
for (wx, wy) in WALLS:
    WALL_MASK[wx, wy] = True
GOAL = np.array([GRID - 1, GRID - 1])


def reset_envs(rng, n):
    pos = np.zeros((n, 2), dtype=np.int64)
    t = np.zeros(n, dtype=np.int64)
    return pos, t


def observe(pos):
    obs = np.zeros((len(pos), 2 * GRID), dtype=np.float32)
    obs[np.arange(len(pos)), pos[:, 0]] = 1.0
    obs[np.arange(len(pos)), GRID + pos[:, 1]] = 1.0
    return obs


def step_envs(pos, t, actions):
    cand = np.clip(pos + MOVES[actions], 0, GRID - 1)
    blocked = WALL_MASK[cand[:, 0], cand[:, 1]]
    new_pos = np.where(blocked[:, None], pos, cand)
    t = t + 1
    at_goal = np.all(new_pos == GOAL, axis=1)
    reward = np.where(at_goal, 1.0, -0.01).astype(np.float32)
    done = at_goal | (t >= MAX_T)
    terminal = at_goal.astype(np.float32)
    new_pos[done] = 0
    t[done] = 0
    return new_pos, t, reward, terminal, done


def make_qnet(obs_dim, n_actions):
    return nn.Sequential(
        nn.Linear(obs_dim, 128), nn.ReLU(),
        nn.Linear(128, 128), nn.ReLU(),
        nn.Linear(128, n_actions),
    )


def bellman_backup(rewards, terminals, next_q, gamma):
    if FIX:
        return rewards + gamma * (1.0 - terminals) * next_q.max(dim=1).values
    out = torch.empty(rewards.shape[0])
    for i in range(rewards.shape[0]):
        out[i] = rewards[i] + gamma * (1.0 - terminals[i]) * next_q[i].max()
    return out


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    obs_dim, n_actions = 2 * GRID, 4
    qnet = make_qnet(obs_dim, n_actions)
    target = make_qnet(obs_dim, n_actions)
    target.load_state_dict(qnet.state_dict())
    opt = torch.optim.Adam(qnet.parameters(), lr=5e-4)

    cap = 50_000
    b_obs = np.zeros((cap, obs_dim), np.float32)
    b_next = np.zeros((cap, obs_dim), np.float32)
    b_act = np.zeros(cap, np.int64)
    b_rew = np.zeros(cap, np.float32)
    b_term = np.zeros(cap, np.float32)
    ptr, size = 0, 0

    pos, t = reset_envs(rng, N_ENVS)
    obs = observe(pos)
    total_steps = 1000
    batch_size = 128
    gamma = 0.97
    returns, ep_ret = [], np.zeros(N_ENVS)
    start = time.perf_counter()
    for step in range(total_steps):
        eps = max(0.05, 1.0 - step / 800)
        with torch.no_grad():
            greedy = qnet(torch.from_numpy(obs)).argmax(1).numpy()
        rand = rng.integers(0, n_actions, N_ENVS)
        actions = np.where(rng.random(N_ENVS) < eps, rand, greedy)
        pos, t, rew, term, done = step_envs(pos, t, actions)
        next_obs = observe(pos)
        idx = (ptr + np.arange(N_ENVS)) % cap
        b_obs[idx], b_act[idx], b_rew[idx], b_term[idx] = obs, actions, rew, term
        b_next[idx] = next_obs
        ptr = (ptr + N_ENVS) % cap
        size = min(size + N_ENVS, cap)
        ep_ret += rew
        for k in np.flatnonzero(done):
            returns.append(ep_ret[k])
            ep_ret[k] = 0.0
        obs = next_obs

        if size >= batch_size:
            j = rng.integers(0, size, batch_size)
            o = torch.from_numpy(b_obs[j])
            a = torch.from_numpy(b_act[j])
            r = torch.from_numpy(b_rew[j])
            d = torch.from_numpy(b_term[j])
            o2 = torch.from_numpy(b_next[j])
            with torch.no_grad():
                y = bellman_backup(r, d, target(o2), gamma)
            q = qnet(o).gather(1, a[:, None]).squeeze(1)
            loss = nn.functional.smooth_l1_loss(q, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % 250 == 0:
            target.load_state_dict(qnet.state_dict())
    elapsed = time.perf_counter() - start
    print(f"episodes={len(returns)} mean_return_last50={np.mean(returns[-50:]):.3f} time={elapsed:.2f}s")


if __name__ == "__main__":
    main()
