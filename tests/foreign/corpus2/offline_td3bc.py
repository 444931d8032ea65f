"""TD3+BC offline RL trained from a fixed dataset through a torch DataLoader."""
import copy
import os
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

from offline.data import TransitionDataset, generate_transitions

FIX = os.environ.get("FIX", "0") == "1"


def _as_is(batch):
    return batch


def make_loader(ds, batch_size, seed):
    g = torch.Generator().manual_seed(seed)
    if FIX:
        sampler = BatchSampler(RandomSampler(ds, generator=g), batch_size, drop_last=True)
        return DataLoader(ds, sampler=sampler, batch_size=None, collate_fn=_as_is, generator=g)
    return DataLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True, generator=g)


class Actor(nn.Module):
    def __init__(self, od, ad, h=256):
        super().__init__()
        self.f = nn.Sequential(nn.Linear(od, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, ad), nn.Tanh())

    def forward(self, o):
        return self.f(o)


class Critic(nn.Module):
    def __init__(self, od, ad, h=256):
        super().__init__()
        self.q1 = nn.Sequential(nn.Linear(od + ad, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))
        self.q2 = nn.Sequential(nn.Linear(od + ad, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 1))

    def forward(self, o, a):
        x = torch.cat([o, a], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(4)
    data = generate_transitions(200_000, seed=4)
    ds = TransitionDataset(data)
    loader = make_loader(ds, 256, seed=4)
    actor, critic = Actor(4, 2, 64), Critic(4, 2, 64)
    actor_t, critic_t = copy.deepcopy(actor), copy.deepcopy(critic)
    a_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    c_opt = torch.optim.Adam(critic.parameters(), lr=3e-4)
    alpha, gamma, tau = 2.5, 0.99, 0.005
    step, max_steps = 0, 1200
    while step < max_steps:
        for b in loader:
            o, a, r, o2, d = b["obs"], b["act"], b["rew"], b["next_obs"], b["done"]
            with torch.no_grad():
                noise = (torch.randn_like(a) * 0.2).clamp(-0.5, 0.5)
                a2 = (actor_t(o2) + noise).clamp(-1, 1)
                y = r + gamma * (1 - d) * torch.min(*critic_t(o2, a2))
            q1, q2 = critic(o, a)
            c_loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
            c_opt.zero_grad()
            c_loss.backward()
            c_opt.step()
            if step % 2 == 0:
                pi = actor(o)
                q = critic(o, pi)[0]
                lmbda = alpha / q.abs().mean().detach()
                a_loss = -lmbda * q.mean() + F.mse_loss(pi, a)
                a_opt.zero_grad()
                a_loss.backward()
                a_opt.step()
                with torch.no_grad():
                    for net, tgt in ((actor, actor_t), (critic, critic_t)):
                        for p, pt in zip(net.parameters(), tgt.parameters()):
                            pt.lerp_(p, tau)
            step += 1
            if step >= max_steps:
                break
    return float(c_loss.detach())


if __name__ == "__main__":
    t0 = time.perf_counter()
    loss = main()
    print(f"critic_loss={loss:.4f} time={time.perf_counter() - t0:.2f}s")
