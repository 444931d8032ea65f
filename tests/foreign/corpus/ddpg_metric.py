"""DDPG on a 2-D point-mass navigation task, tracking a state-coverage metric for the paper's plots.

Planted (hot_spot -- no checklist rule): the coverage metric (share of close pairs among the last
1000 visited states, via ``torch.cdist``) is recomputed at every step. ``--fixed`` computes it every
1000 steps, when it is plotted.
"""
import argparse

import numpy as np
import torch
from torch import nn


def coverage_metric(states: torch.Tensor) -> float:
    """Share of state pairs closer than 0.05: low means the agent explores widely."""
    close = torch.cdist(states, states) < 0.05
    return close.float().mean().item()


class PointMass:
    def __init__(self, seed=0):
        self.rng = np.random.default_rng(seed)
        self.reset()

    def reset(self):
        self.pos = self.rng.uniform(-1, 1, 2).astype(np.float32)
        self.goal = self.rng.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return np.concatenate([self.pos, self.goal])

    def step(self, action):
        self.pos = np.clip(self.pos + 0.05 * np.clip(action, -1, 1), -1, 1).astype(np.float32)
        self.t += 1
        dist = float(np.linalg.norm(self.pos - self.goal))
        done = dist < 0.05 or self.t >= 100
        return np.concatenate([self.pos, self.goal]), -dist, done


def mlp(inp, out, act=None):
    layers = [nn.Linear(inp, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, out)]
    return nn.Sequential(*layers, *([act] if act else []))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    env = PointMass()
    actor, critic = mlp(4, 2, nn.Tanh()), mlp(6, 1)
    actor_t, critic_t = mlp(4, 2, nn.Tanh()), mlp(6, 1)
    actor_t.load_state_dict(actor.state_dict())
    critic_t.load_state_dict(critic.state_dict())
    a_opt, c_opt = torch.optim.Adam(actor.parameters(), 1e-3), torch.optim.Adam(critic.parameters(), 1e-3)
    cap, size = 50_000, 0
    S, A, R, S2, D = (torch.zeros(cap, 4), torch.zeros(cap, 2), torch.zeros(cap, 1), torch.zeros(cap, 4), torch.zeros(cap, 1))
    visited = torch.zeros(1000, 2)
    coverage = []
    obs = env.reset()
    steps = int(args.steps * args.scale)
    for step in range(steps):
        with torch.no_grad():
            action = actor(torch.from_numpy(obs)).numpy() + 0.2 * rng.standard_normal(2).astype(np.float32)
        next_obs, reward, done = env.step(action)
        i = size % cap
        S[i], A[i], S2[i] = torch.from_numpy(obs), torch.from_numpy(action), torch.from_numpy(next_obs)
        R[i], D[i] = reward, float(done)
        size += 1
        visited[step % len(visited)] = torch.from_numpy(next_obs[:2])
        obs = env.reset() if done else next_obs
        if not args.fixed or step % 1000 == 0:
            coverage.append(coverage_metric(visited[:min(size, len(visited))]))  # planted: hot_spot
        if size >= 128 and step % 2 == 0:
            b = torch.randint(0, min(size, cap), (128,))
            with torch.no_grad():
                y = R[b] + 0.99 * (1 - D[b]) * critic_t(torch.cat([S2[b], actor_t(S2[b])], 1))
            c_loss = (critic(torch.cat([S[b], A[b]], 1)) - y).pow(2).mean()
            c_opt.zero_grad()
            c_loss.backward()
            c_opt.step()
            a_loss = -critic(torch.cat([S[b], actor(S[b])], 1)).mean()
            a_opt.zero_grad()
            a_loss.backward()
            a_opt.step()
            with torch.no_grad():
                for net, tgt in ((actor, actor_t), (critic, critic_t)):
                    for p, tp in zip(net.parameters(), tgt.parameters(), strict=True):
                        tp.lerp_(p, 0.005)
    print(f"{steps} steps, final coverage {coverage[-1]:.4f}")


if __name__ == "__main__":
    main()
