"""PPO written as plain functions (no classes): a functional env over a dict of arrays, a policy as a
dict of parameter tensors, rollout / advantage / update functions.

Planted (device_transfer): the rollout moves data between NumPy and torch at every step -- each
observation field becomes a fresh tensor (``torch.tensor(...).to(device)``) and the action, log-prob
and value come back with ``.cpu().numpy()`` into NumPy lists. ``--fixed`` lets the env write into
one preallocated array shared with torch (``torch.from_numpy`` once) and keeps the rollout in
preallocated tensors.
"""
import argparse

import numpy as np
import torch
import torch.nn.functional as F

DEVICE = torch.device("cpu")
SECTORS = 96
FIELDS = {"position": 2, "velocity": 2, "goal": 2, "last_action": 4, "time": 1, **{f"lidar_{k}": 2 for k in range(SECTORS)}}
OBS_DIM = sum(FIELDS.values())


def env_reset(rng):
    return {"pos": rng.uniform(-1, 1, 2), "vel": np.zeros(2), "goal": rng.uniform(-1, 1, 2), "t": 0, "last": 0,
            "walls": rng.uniform(-1, 1, (2 * SECTORS, 2))}


def env_observe(state, out):
    """Writes the observation fields into the views of ``out``."""
    out["position"][:] = state["pos"]
    out["velocity"][:] = state["vel"]
    out["goal"][:] = state["goal"] - state["pos"]
    lidar = np.linalg.norm(state["walls"] - state["pos"], axis=1)
    for k in range(SECTORS):
        out[f"lidar_{k}"][:] = lidar[2 * k:2 * k + 2]
    out["last_action"][:] = 0.0
    out["last_action"][state["last"]] = 1.0
    out["time"][:] = state["t"] / 100


def env_step(state, action, rng):
    push = np.array([[0.0, 0.05], [0.05, 0.0], [0.0, -0.05], [-0.05, 0.0]])[action]
    vel = 0.8 * state["vel"] + push
    pos = np.clip(state["pos"] + vel, -1, 1)
    dist = np.linalg.norm(pos - state["goal"])
    reward = -dist - 0.1 * (np.linalg.norm(state["walls"] - pos, axis=1) < 0.1).sum()
    done = bool(dist < 0.1 or state["t"] + 1 >= 100)
    new = dict(state, pos=pos, vel=vel, t=state["t"] + 1, last=action)
    return (env_reset(rng) if done else new), float(reward), done


def init_policy(gen):
    def lin(i, o):
        return torch.randn(i, o, generator=gen) * (2 / i) ** 0.5, torch.zeros(o)
    params = {}
    params["w1"], params["b1"] = lin(OBS_DIM, 64)
    params["w2"], params["b2"] = lin(64, 64)
    params["wpi"], params["bpi"] = lin(64, 4)
    params["wv"], params["bv"] = lin(64, 1)
    for p in params.values():
        p.requires_grad_(True)
    return params


def policy(params, obs):
    h = torch.tanh(obs @ params["w1"] + params["b1"])
    h = torch.tanh(h @ params["w2"] + params["b2"])
    return h @ params["wpi"] + params["bpi"], (h @ params["wv"] + params["bv"]).squeeze(-1)


def views(flat):
    out, start = {}, 0
    for name, width in FIELDS.items():
        out[name] = flat[start:start + width]
        start += width
    return out


def rollout_slow(params, state, rng, gen, n_steps):
    obs_l, act_l, logp_l, val_l, rew_l, done_l = [], [], [], [], [], []
    fields = {name: np.zeros(width) for name, width in FIELDS.items()}
    for _ in range(n_steps):
        env_observe(state, fields)
        obs = torch.cat([torch.tensor(fields[k], dtype=torch.float32).to(DEVICE) for k in FIELDS])  # planted: device_transfer
        with torch.no_grad():
            logits, value = policy(params, obs)
            action = torch.multinomial(F.softmax(logits, -1), 1, generator=gen)[0]
            logp = F.log_softmax(logits, -1)[action]
        a, lp, v = action.cpu().numpy(), logp.cpu().numpy(), value.cpu().numpy()  # planted: device_transfer
        state, reward, done = env_step(state, int(a), rng)
        r, d = torch.tensor(reward).to(DEVICE), torch.tensor(float(done)).to(DEVICE)  # planted: device_transfer
        obs_l.append(obs.cpu().numpy())
        act_l.append(a)
        logp_l.append(lp)
        val_l.append(v)
        rew_l.append(r.cpu().numpy())
        done_l.append(d.cpu().numpy())
    batch = [torch.tensor(np.array(x), dtype=dt).to(DEVICE) for x, dt in
             ((obs_l, torch.float32), (act_l, torch.long), (logp_l, torch.float32), (val_l, torch.float32),
              (rew_l, torch.float32), (done_l, torch.float32))]
    return state, batch


def rollout_fast(params, state, rng, gen, n_steps, bufs):
    flat, obs_t, acts, logps, vals, rews, dones, obs_buf = bufs
    fields = views(flat)
    for t in range(n_steps):
        env_observe(state, fields)
        with torch.no_grad():
            logits, value = policy(params, obs_t)
            action = torch.multinomial(F.softmax(logits, -1), 1, generator=gen)[0]
            logp = F.log_softmax(logits, -1)[action]
        state, reward, done = env_step(state, int(action), rng)
        obs_buf[t] = obs_t
        acts[t], logps[t], vals[t], rews[t], dones[t] = action, logp, value, reward, done
    return state, [buf.clone() for buf in (obs_buf, acts, logps, vals, rews, dones)]


def advantages(rewards, values, dones, gamma=0.99, lam=0.95):
    adv = torch.zeros_like(rewards)
    last = 0.0
    for t in reversed(range(len(rewards))):
        next_v = values[t + 1] if t + 1 < len(rewards) else 0.0
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_v * nonterminal - values[t]
        last = delta + gamma * lam * nonterminal * last
        adv[t] = last
    return adv


def update(params, opt, batch, epochs=2):
    obs, acts, old_logp, values, rewards, dones = batch
    adv = advantages(rewards, values, dones)
    returns = adv + values
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    for _ in range(epochs):
        logits, v = policy(params, obs)
        logp = F.log_softmax(logits, -1).gather(1, acts[:, None]).squeeze(1)
        ratio = (logp - old_logp).exp()
        pg = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv).mean()
        loss = pg + 0.5 * (v - returns).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--fixed", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    params = init_policy(gen)
    opt = torch.optim.Adam(params.values(), lr=3e-4)
    n_steps = 256
    flat = np.zeros(OBS_DIM, np.float32)
    bufs = (flat, torch.from_numpy(flat), torch.zeros(n_steps, dtype=torch.long), torch.zeros(n_steps),
            torch.zeros(n_steps), torch.zeros(n_steps), torch.zeros(n_steps), torch.zeros(n_steps, OBS_DIM))
    state = env_reset(rng)
    for _ in range(max(1, int(args.iterations * args.scale))):
        if args.fixed:
            state, batch = rollout_fast(params, state, rng, gen, n_steps, bufs)
        else:
            state, batch = rollout_slow(params, state, rng, gen, n_steps)
        loss = update(params, opt, batch)
    print(f"last loss {loss:.4f}")


if __name__ == "__main__":
    main()
