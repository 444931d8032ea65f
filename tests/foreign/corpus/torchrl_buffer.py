"""DQN over 48 torch "lander" envs with TorchRL's ReplayBuffer (LazyTensorStorage) of TensorDicts.

Planted (host_copy): each vector step adds the 48 transitions one at a time, building a TensorDict
per transition from ``.item()`` reads. ``--fixed`` extends the buffer with one batched TensorDict.
"""
import argparse

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.data import LazyTensorStorage, ReplayBuffer

N = 48


def lander_step(state, action):
    """state: (N, 4) height, vertical speed, fuel, time. Actions: 0 idle, 1 small burn, 2 big burn."""
    thrust = torch.tensor([0.0, 0.6, 1.4])[action]
    h, v, fuel, t = state.unbind(1)
    v = v - 0.1 + 0.1 * thrust * (fuel > 0)
    h = h + 0.1 * v
    fuel = (fuel - 0.01 * thrust).clamp(min=0)
    t = t + 1
    landed = h <= 0
    reward = torch.where(landed, 1.0 - v.abs(), -0.01 * thrust)
    done = landed | (t >= 100)
    fresh = torch.stack([torch.full((N,), 1.0), torch.zeros(N), torch.ones(N), torch.zeros(N)], 1)
    next_state = torch.stack([h, v, fuel, t], 1)
    return torch.where(done[:, None], fresh, next_state), next_state, reward, done


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rb = ReplayBuffer(storage=LazyTensorStorage(100_000), batch_size=128)
    q = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    target = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 3))
    target.load_state_dict(q.state_dict())
    opt = torch.optim.Adam(q.parameters(), lr=1e-3)
    state = torch.stack([torch.ones(N), torch.zeros(N), torch.ones(N), torch.zeros(N)], 1)
    steps = int(args.steps * args.scale)
    for step in range(steps):
        eps = max(0.05, 1 - step / (0.5 * steps))
        with torch.no_grad():
            action = q(state).argmax(1)
        action = torch.where(torch.rand(N) < eps, torch.randint(0, 3, (N,)), action)
        next_state, final_state, reward, done = lander_step(state, action)
        if args.fixed:
            rb.extend(TensorDict({"obs": state, "action": action, "reward": reward, "next_obs": final_state,
                                  "done": done.float()}, batch_size=[N]))
        else:
            for i in range(N):
                rb.add(TensorDict({"obs": state[i], "action": torch.tensor(action[i].item()),  # planted: host_copy
                                   "reward": torch.tensor(reward[i].item()), "next_obs": final_state[i],
                                   "done": torch.tensor(float(done[i].item()))}, batch_size=[]))
        state = next_state
        if step >= 8 and step % 2 == 0:
            batch = rb.sample()
            with torch.no_grad():
                y = batch["reward"] + 0.99 * (1 - batch["done"]) * target(batch["next_obs"]).max(1).values
            qa = q(batch["obs"]).gather(1, batch["action"][:, None]).squeeze(1)
            loss = nn.functional.smooth_l1_loss(qa, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if step % 200 == 0:
            target.load_state_dict(q.state_dict())
    print(f"{steps} steps, {len(rb)} transitions stored")


if __name__ == "__main__":
    main()
