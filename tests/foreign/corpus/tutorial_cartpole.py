"""Reinforcement Learning (DQN) Tutorial, adapted: a recurrent Q-network (a GRU over the last 48
observations) on CartPole, in the PyTorch tutorial's style (globals, select_action, optimize_model).

Planted (autograd_forward): select_action calls the policy net with grad mode on, so every action
records an autograd graph through the GRU (which also leaves its fused inference kernel).
``--fixed`` wraps the call in ``torch.no_grad()`` as the tutorial does.
"""
import argparse
import math
import random
from collections import namedtuple

import gymnasium as gym
import torch
import torch.nn as nn
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument("--fixed", action="store_true")
parser.add_argument("--scale", type=float, default=1.0)
args = parser.parse_args()

torch.set_num_threads(1)
random.seed(0)
torch.manual_seed(0)
env = gym.make("CartPole-v1")
device = torch.device("cpu")

Transition = namedtuple("Transition", ("state", "action", "next_state", "reward", "done"))
HISTORY = 48
BATCH_SIZE = 32
GAMMA = 0.99
EPS_START = 0.9
EPS_END = 0.05
EPS_DECAY = 200
LR = 1e-4
OPTIMIZE_EVERY = 128
TARGET_EVERY = 500
CAPACITY = 10000


class ReplayMemory:
    """Preallocated tensors (the tutorial's deque, made fast)."""

    def __init__(self, capacity, n_obs):
        self.state = torch.zeros(capacity, HISTORY, n_obs)
        self.next_state = torch.zeros(capacity, HISTORY, n_obs)
        self.action = torch.zeros(capacity, 1, dtype=torch.long)
        self.reward = torch.zeros(capacity)
        self.done = torch.zeros(capacity)
        self.capacity, self.position, self.size = capacity, 0, 0

    def push(self, t):
        i = self.position
        self.state[i], self.next_state[i], self.action[i], self.reward[i], self.done[i] = t
        self.position = (i + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size):
        idx = torch.randint(0, self.size, (batch_size,))
        return Transition(self.state[idx], self.action[idx], self.next_state[idx], self.reward[idx], self.done[idx])

    def __len__(self):
        return self.size


class DQN(nn.Module):
    def __init__(self, n_observations, n_actions, hidden=128):
        super().__init__()
        self.gru = nn.GRU(n_observations, hidden, batch_first=True)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, x):
        out, _ = self.gru(x)
        return self.head(out[:, -1])


n_actions = env.action_space.n
n_observations = env.observation_space.shape[0]
policy_net = DQN(n_observations, n_actions).to(device)
target_net = DQN(n_observations, n_actions).to(device)
target_net.load_state_dict(policy_net.state_dict())
target_net.eval()
optimizer = optim.AdamW(policy_net.parameters(), lr=LR, amsgrad=True)
memory = ReplayMemory(CAPACITY, n_observations)
steps_done = 0


def select_action(history):
    global steps_done
    sample = random.random()
    eps_threshold = EPS_END + (EPS_START - EPS_END) * math.exp(-1.0 * steps_done / EPS_DECAY)
    steps_done += 1
    if sample > eps_threshold:
        if args.fixed:
            with torch.no_grad():
                return policy_net(history.unsqueeze(0)).max(1).indices.view(1, 1)
        return policy_net(history.unsqueeze(0)).max(1).indices.view(1, 1)  # planted: autograd_forward
    return torch.tensor([[env.action_space.sample()]], device=device, dtype=torch.long)


def optimize_model():
    if len(memory) < BATCH_SIZE:
        return
    batch = memory.sample(BATCH_SIZE)
    state_action_values = policy_net(batch.state).gather(1, batch.action).squeeze(1)
    with torch.no_grad():
        next_state_values = target_net(batch.next_state).max(1).values * (1 - batch.done)
    expected_state_action_values = (next_state_values * GAMMA) + batch.reward
    criterion = nn.SmoothL1Loss()
    loss = criterion(state_action_values, expected_state_action_values)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_value_(policy_net.parameters(), 100)
    optimizer.step()


total_steps = int(2000 * args.scale)
episode_durations = []
while steps_done < total_steps:
    state, info = env.reset(seed=len(episode_durations))
    history = torch.zeros(HISTORY, n_observations)
    history[-1] = torch.as_tensor(state)
    for t in range(500):
        action = select_action(history)
        observation, reward, terminated, truncated, _ = env.step(action.item())
        next_history = torch.roll(history, -1, 0)
        next_history[-1] = torch.as_tensor(observation)
        memory.push((history, next_history, action, reward, float(terminated)))
        history = next_history
        if steps_done % OPTIMIZE_EVERY == 0:
            optimize_model()
        if steps_done % TARGET_EVERY == 0:
            target_net.load_state_dict(policy_net.state_dict())
        if terminated or truncated or steps_done >= total_steps:
            episode_durations.append(t + 1)
            break

print(f"Complete: {len(episode_durations)} episodes, {steps_done} steps")
