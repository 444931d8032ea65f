"""A class-based DQN trainer over a grid world written in torch (16 boards stepped as one tensor).

Planted (update_ratio): the trainer runs 8 gradient updates per vector step, a replay ratio copied
from a single-env recipe. ``--fixed`` runs one update per vector step.
"""
import argparse
import copy

import torch
import torch.nn.functional as F
from torch import nn


class GridWorld:
    """N boards of SIZE x SIZE; the agent walks to a goal cell; observation is the one-hot board."""

    MOVES = torch.tensor([[-1, 0], [1, 0], [0, -1], [0, 1]])

    def __init__(self, n, size=7, seed=0):
        self.n, self.size = n, size
        self.gen = torch.Generator().manual_seed(seed)
        self.agent = torch.zeros(n, 2, dtype=torch.long)
        self.goal = torch.randint(0, size, (n, 2), generator=self.gen)
        self.t = torch.zeros(n, dtype=torch.long)

    def observe(self):
        board = torch.zeros(self.n, 2, self.size, self.size)
        rows = torch.arange(self.n)
        board[rows, 0, self.agent[:, 0], self.agent[:, 1]] = 1.0
        board[rows, 1, self.goal[:, 0], self.goal[:, 1]] = 1.0
        return board.flatten(1)

    def step(self, actions):
        self.agent = (self.agent + self.MOVES[actions]).clamp(0, self.size - 1)
        self.t += 1
        reached = (self.agent == self.goal).all(1)
        reward = reached.float() - 0.01
        done = reached | (self.t >= 30)
        if done.any():
            k = int(done.sum())
            self.agent[done] = 0
            self.t[done] = 0
            self.goal[done] = torch.randint(0, self.size, (k, 2), generator=self.gen)
        return self.observe(), reward, done


class Trainer:
    def __init__(self, config):
        self.cfg = config
        self.env = GridWorld(config["num_envs"], seed=config["seed"])
        obs_dim = 2 * self.env.size ** 2
        self.online = nn.Sequential(nn.Linear(obs_dim, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, 4))
        self.target = copy.deepcopy(self.online)
        self.optim = torch.optim.Adam(self.online.parameters(), lr=config["lr"])
        cap = config["capacity"]
        self.mem_obs = torch.zeros(cap, obs_dim)
        self.mem_next = torch.zeros(cap, obs_dim)
        self.mem_act = torch.zeros(cap, dtype=torch.long)
        self.mem_rew = torch.zeros(cap)
        self.mem_done = torch.zeros(cap)
        self.cursor, self.filled = 0, 0
        self.updates = 0

    def remember(self, obs, act, rew, next_obs, done):
        idx = (self.cursor + torch.arange(obs.shape[0])) % self.mem_obs.shape[0]
        self.mem_obs[idx], self.mem_act[idx], self.mem_rew[idx] = obs, act, rew
        self.mem_next[idx], self.mem_done[idx] = next_obs, done.float()
        self.cursor = int(idx[-1] + 1) % self.mem_obs.shape[0]
        self.filled = min(self.filled + obs.shape[0], self.mem_obs.shape[0])

    def act(self, obs, epsilon):
        with torch.no_grad():
            greedy = self.online(obs).argmax(1)
        random_actions = torch.randint(0, 4, greedy.shape)
        return torch.where(torch.rand(greedy.shape) < epsilon, random_actions, greedy)

    def learn(self):
        idx = torch.randint(0, self.filled, (self.cfg["batch_size"],))
        obs, act, rew = self.mem_obs[idx], self.mem_act[idx], self.mem_rew[idx]
        next_obs, done = self.mem_next[idx], self.mem_done[idx]
        with torch.no_grad():
            target = rew + self.cfg["gamma"] * (1 - done) * self.target(next_obs).max(1).values
        q = self.online(obs).gather(1, act[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.optim.zero_grad()
        loss.backward()
        self.optim.step()
        self.updates += 1
        if self.updates % self.cfg["target_every"] == 0:
            self.target.load_state_dict(self.online.state_dict())
        return loss

    def fit(self, vector_steps):
        obs = self.env.observe()
        episodes = 0
        for step in range(vector_steps):
            epsilon = max(0.05, 1 - step / (0.6 * vector_steps))
            actions = self.act(obs, epsilon)
            next_obs, reward, done = self.env.step(actions)
            self.remember(obs, actions, reward, next_obs, done)
            obs = next_obs
            episodes += int(done.sum())
            if self.filled >= self.cfg["batch_size"]:
                for _ in range(self.cfg["updates_per_step"]):  # planted: update_ratio
                    self.learn()
        return episodes


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixed", action="store_true", help="one update per vector step")
    parser.add_argument("--scale", type=float, default=1.0)
    cli = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = {"num_envs": 16, "seed": 0, "lr": 5e-4, "capacity": 50_000, "batch_size": 128, "gamma": 0.97,
              "target_every": 200, "updates_per_step": 1 if cli.fixed else 8}
    trainer = Trainer(config)
    n = trainer.fit(int(500 * cli.scale))
    print(f"{n} episodes, {trainer.updates} updates")
