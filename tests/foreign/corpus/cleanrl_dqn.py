"""CleanRL-style single-file DQN on CartPole: dataclass arguments, one loop top to bottom.

Planted (replay_sampling): the replay buffer is a deque of tuples, and every sample rebuilds the
batch with one list comprehension per field. ``--fixed`` uses a NumPy ring buffer sampled by index.
"""
import argparse
import warnings
import random
import time
from collections import deque
from dataclasses import dataclass, fields

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Args:
    seed: int = 1
    """seed of the experiment"""
    total_timesteps: int = 4000
    """total timesteps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    buffer_size: int = 10000
    """the replay memory buffer size"""
    gamma: float = 0.99
    """the discount factor gamma"""
    target_network_frequency: int = 500
    """the timesteps it takes to update the target network"""
    batch_size: int = 256
    """the batch size of sample from the replay memory"""
    start_e: float = 1.0
    end_e: float = 0.05
    exploration_fraction: float = 0.5
    learning_starts: int = 1000
    """timestep to start learning"""
    train_frequency: int = 1
    """the frequency of training"""
    scale: float = 1.0
    """multiplies total_timesteps"""
    fixed: bool = False
    """use the NumPy ring buffer"""


def parse_args() -> Args:
    parser = argparse.ArgumentParser()
    for f in fields(Args):
        if f.type in ("bool", bool):
            parser.add_argument(f"--{f.name.replace('_', '-')}", action="store_true")
        else:
            parser.add_argument(f"--{f.name.replace('_', '-')}", type=type(f.default), default=f.default)
    return Args(**vars(parser.parse_args()))


class TupleReplay:
    def __init__(self, size):
        self.memory = deque(maxlen=size)

    def add(self, obs, next_obs, action, reward, done):
        self.memory.append((obs, next_obs, action, reward, done))

    def sample(self, n):
        batch = random.sample(self.memory, n)
        obs = torch.tensor([t[0] for t in batch], dtype=torch.float32)
        next_obs = torch.tensor([t[1] for t in batch], dtype=torch.float32)
        actions = torch.tensor([[t[2]] for t in batch])
        rewards = torch.tensor([t[3] for t in batch], dtype=torch.float32)
        dones = torch.tensor([float(t[4]) for t in batch])
        return obs, next_obs, actions, rewards, dones


class RingReplay:
    def __init__(self, size, obs_dim):
        self.obs = np.zeros((size, obs_dim), np.float32)
        self.next_obs = np.zeros((size, obs_dim), np.float32)
        self.actions = np.zeros((size, 1), np.int64)
        self.rewards = np.zeros(size, np.float32)
        self.dones = np.zeros(size, np.float32)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, next_obs, action, reward, done):
        self.obs[self.pos], self.next_obs[self.pos] = obs, next_obs
        self.actions[self.pos], self.rewards[self.pos], self.dones[self.pos] = action, reward, done
        self.pos = (self.pos + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, n):
        idx = np.random.randint(0, self.size if self.full else self.pos, n)
        return (torch.from_numpy(self.obs[idx]), torch.from_numpy(self.next_obs[idx]), torch.from_numpy(self.actions[idx]),
                torch.from_numpy(self.rewards[idx]), torch.from_numpy(self.dones[idx]))


class QNetwork(nn.Module):
    def __init__(self, obs_dim, n_actions):
        super().__init__()
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_actions)
        )

    def forward(self, x):
        return self.network(x)


def linear_schedule(start_e: float, end_e: float, duration: int, t: int):
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


if __name__ == "__main__":
    args = parse_args()
    args.total_timesteps = int(args.total_timesteps * args.scale)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message="Creating a tensor from a list of numpy.ndarrays")

    env = gym.make("CartPole-v1")
    obs_dim, n_actions = env.observation_space.shape[0], env.action_space.n
    q_network = QNetwork(obs_dim, n_actions)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate)
    target_network = QNetwork(obs_dim, n_actions)
    target_network.load_state_dict(q_network.state_dict())
    rb = RingReplay(args.buffer_size, obs_dim) if args.fixed else TupleReplay(args.buffer_size)
    start_time = time.time()

    obs, _ = env.reset(seed=args.seed)
    episodic_return = 0.0
    for global_step in range(args.total_timesteps):
        duration = args.exploration_fraction * args.total_timesteps
        epsilon = linear_schedule(args.start_e, args.end_e, duration, global_step)
        if random.random() < epsilon:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = int(q_network(torch.from_numpy(obs)).argmax())

        next_obs, reward, terminated, truncated, info = env.step(action)
        episodic_return += reward

        rb.add(obs, next_obs, action, reward, terminated)

        # CRUCIAL step easy to overlook
        obs = next_obs
        if terminated or truncated:
            obs, _ = env.reset()
            episodic_return = 0.0

        if global_step > args.learning_starts and global_step % args.train_frequency == 0:
            b_obs, b_next_obs, b_actions, b_rewards, b_dones = rb.sample(args.batch_size)  # planted: replay_sampling
            with torch.no_grad():
                target_max, _ = target_network(b_next_obs).max(dim=1)
                td_target = b_rewards + args.gamma * target_max * (1 - b_dones)
            old_val = q_network(b_obs).gather(1, b_actions).squeeze()
            loss = F.mse_loss(td_target, old_val)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

            if global_step % args.target_network_frequency == 0:
                target_network.load_state_dict(q_network.state_dict())

    print(f"SPS: {int(args.total_timesteps / (time.time() - start_time))}")
    env.close()
