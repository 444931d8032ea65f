"""Actor-learner training with multiprocessing actors and a V-trace-lite learner."""
import multiprocessing as mp
import os
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn

from distributed.actor import actor_loop, build_policy

FIX = os.environ.get("FIX", "0") == "1"
N_ACTORS = 2
UNROLL = 20


def publish(policy, path, version):
    tmp = path + ".tmp"
    torch.save(policy.state_dict(), tmp)
    os.replace(tmp, path)
    with version.get_lock():
        version.value += 1


def vtrace_lite(behav_lp, target_lp, rew, done, values, boot, gamma=0.99, rho_bar=1.0):
    rho = torch.clamp((target_lp - behav_lp).exp(), max=rho_bar)
    T = rew.shape[0]
    vs = torch.zeros_like(values)
    acc = torch.zeros_like(boot)
    nxt_v = boot
    for t in reversed(range(T)):
        disc = gamma * (1.0 - done[t])
        delta = rho[t] * (rew[t] + disc * nxt_v - values[t])
        acc = delta + disc * rho[t].clamp(max=1.0) * acc
        vs[t] = values[t] + acc
        nxt_v = values[t]
    return vs, rho


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    ctx = mp.get_context("fork")
    workdir = tempfile.mkdtemp(prefix="impala_")
    wpath = os.path.join(workdir, "policy.pt")
    policy = build_policy(20, 3)
    value = nn.Sequential(nn.Linear(20, 128), nn.ReLU(), nn.Linear(128, 1))
    opt = torch.optim.Adam(list(policy.parameters()) + list(value.parameters()), lr=1e-3)
    version = ctx.Value("i", 0)
    publish(policy, wpath, version)
    q = ctx.Queue(maxsize=8)
    stop = ctx.Event()
    procs = [ctx.Process(target=actor_loop, args=(i, wpath, version, q, stop, UNROLL, FIX), daemon=True)
             for i in range(N_ACTORS)]
    for p in procs:
        p.start()
    rewards = []
    for update in range(120):
        O, A, R, D, LP, last = q.get()
        o = torch.from_numpy(O)
        logits = policy(o)
        dist = torch.distributions.Categorical(logits=logits)
        tlp = dist.log_prob(torch.from_numpy(A))
        v = value(o).squeeze(-1)
        with torch.no_grad():
            boot = value(torch.from_numpy(last)).squeeze(-1)
            vs, rho = vtrace_lite(torch.from_numpy(LP), tlp.detach(), torch.from_numpy(R),
                                  torch.from_numpy(D.astype(np.float32)), v.detach(), boot)
            nxt = torch.cat([vs[1:], boot[None]])
            pg_adv = rho * (torch.from_numpy(R) + 0.99 * (1 - torch.from_numpy(D.astype(np.float32))) * nxt - v.detach())
        loss = -(tlp * pg_adv).mean() + 0.5 * (vs - v).pow(2).mean() - 0.01 * dist.entropy().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        publish(policy, wpath, version)
        rewards.append(R.sum() / max(1, D.sum()))
    stop.set()
    for p in procs:
        p.join(timeout=5)
    return rewards


if __name__ == "__main__":
    t0 = time.perf_counter()
    rw = main()
    print(f"updates={len(rw)} last20_score={np.mean(rw[-20:]):.3f} time={time.perf_counter() - t0:.2f}s")
