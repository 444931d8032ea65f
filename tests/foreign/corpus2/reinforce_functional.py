"""REINFORCE with baseline, written in a functional / jax-like style with pure numpy.

Parameters are a dict pytree; every function is pure and returns new state.
"""
import os
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import numpy as np  # noqa: E402

FIX = os.environ.get("FIX", "0") == "1"

# ---------------------------------------------------------------- pytree utils

def tree_map(f, *trees):
    return {k: f(*(t[k] for t in trees)) for k in trees[0]}


def tree_leaves(tree):
    return [tree[k] for k in sorted(tree)]


# ---------------------------------------------------------------- environment (batched cart-pole)

GRAV, MC, MP, HL, FMAG, DT = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02


def env_init(rng, n):
    return rng.uniform(-0.05, 0.05, (n, 4))


def env_step(state, action):
    x, xd, th, thd = state.T
    force = np.where(action == 1, FMAG, -FMAG)
    ct, st = np.cos(th), np.sin(th)
    tmp = (force + MP * HL * thd ** 2 * st) / (MC + MP)
    thacc = (GRAV * st - ct * tmp) / (HL * (4.0 / 3.0 - MP * ct ** 2 / (MC + MP)))
    xacc = tmp - MP * HL * thacc * ct / (MC + MP)
    new = np.stack([x + DT * xd, xd + DT * xacc, th + DT * thd, thd + DT * thacc], 1)
    fail = (np.abs(new[:, 0]) > 2.4) | (np.abs(new[:, 2]) > 0.2095)
    return new, fail


# ---------------------------------------------------------------- model

def init_params(rng, sizes=(4, 64, 64, 2)):
    p = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        p[f"w{i}"] = rng.normal(0, np.sqrt(2.0 / a), (a, b))
        p[f"b{i}"] = np.zeros(b)
    return p


def forward(params, x):
    h0 = np.tanh(x @ params["w0"] + params["b0"])
    h1 = np.tanh(h0 @ params["w1"] + params["b1"])
    logits = h1 @ params["w2"] + params["b2"]
    return logits, (x, h0, h1)


def log_softmax(z):
    z = z - z.max(1, keepdims=True)
    return z - np.log(np.exp(z).sum(1, keepdims=True))


def objective(params, batch):
    obs, act, adv = batch
    logits, _ = forward(params, obs)
    lp = log_softmax(logits)[np.arange(len(act)), act]
    return -(lp * adv).mean()


def value_and_grad(params, batch):
    obs, act, adv = batch
    n = len(act)
    logits, (x, h0, h1) = forward(params, obs)
    ls = log_softmax(logits)
    loss = -(ls[np.arange(n), act] * adv).mean()
    probs = np.exp(ls)
    onehot = np.zeros_like(probs)
    onehot[np.arange(n), act] = 1.0
    dlogits = (probs - onehot) * adv[:, None] / n
    g = {"w2": h1.T @ dlogits, "b2": dlogits.sum(0)}
    dh1 = dlogits @ params["w2"].T * (1 - h1 ** 2)
    g["w1"], g["b1"] = h0.T @ dh1, dh1.sum(0)
    dh0 = dh1 @ params["w1"].T * (1 - h0 ** 2)
    g["w0"], g["b0"] = x.T @ dh0, dh0.sum(0)
    return loss, g


def adam_init(params):
    z = tree_map(np.zeros_like, params)
    return {"m": z, "v": tree_map(np.zeros_like, params), "t": 0}


def adam_apply(params, grads, state, lr=3e-3, b1=0.9, b2=0.999, eps=1e-8):
    t = state["t"] + 1
    m = tree_map(lambda m_, g: b1 * m_ + (1 - b1) * g, state["m"], grads)
    v = tree_map(lambda v_, g: b2 * v_ + (1 - b2) * g * g, state["v"], grads)
    new = tree_map(lambda p, m_, v_: p - lr * (m_ / (1 - b1 ** t)) / (np.sqrt(v_ / (1 - b2 ** t)) + eps),
                   params, m, v)
    return new, {"m": m, "v": v, "t": t}


def audit_gradients(params, grads, batch, rng, n_probe=12, h=1e-5):
    """Compare analytic gradients to central finite differences on random coordinates."""
    for _ in range(n_probe):
        key = sorted(params)[rng.integers(len(params))]
        flat_idx = rng.integers(params[key].size)
        idx = np.unravel_index(flat_idx, params[key].shape)
        plus = {k: v.copy() for k, v in params.items()}
        minus = {k: v.copy() for k, v in params.items()}
        plus[key][idx] += h
        minus[key][idx] -= h
        numeric = (objective(plus, batch) - objective(minus, batch)) / (2 * h)
        assert abs(numeric - grads[key][idx]) < 1e-4 + 1e-2 * abs(numeric), (key, idx)
    assert all(np.isfinite(leaf).all() for leaf in tree_leaves(grads))


# ---------------------------------------------------------------- training

def rollout(params, rng, n_envs=16, horizon=100):
    state = env_init(rng, n_envs)
    alive = np.ones(n_envs, bool)
    obs_l, act_l, rew_l, mask_l = [], [], [], []
    for _ in range(horizon):
        logits, _ = forward(params, state)
        p = np.exp(log_softmax(logits))
        act = (rng.random(n_envs) < p[:, 1]).astype(np.int64)
        obs_l.append(state)
        act_l.append(act)
        mask_l.append(alive.copy())
        state, fail = env_step(state, act)
        rew_l.append(alive.astype(np.float64))
        alive = alive & ~fail
        if not alive.any():
            break
    return np.stack(obs_l), np.stack(act_l), np.stack(rew_l), np.stack(mask_l)


def discounted(rew, gamma):
    out = np.zeros_like(rew)
    acc = np.zeros(rew.shape[1])
    for t in reversed(range(len(rew))):
        acc = rew[t] + gamma * acc
        out[t] = acc
    return out


def train(iterations=150, seed=0):
    rng = np.random.default_rng(seed)
    probe_rng = np.random.default_rng(seed + 1)
    params = init_params(rng)
    opt = adam_init(params)
    history = []
    for it in range(iterations):
        obs, act, rew, mask = rollout(params, rng)
        ret = discounted(rew, 0.99)
        base = (ret * mask).sum(1, keepdims=True) / np.maximum(mask.sum(1, keepdims=True), 1)
        adv = (ret - base)
        m = mask.reshape(-1)
        batch = (obs.reshape(-1, 4)[m], act.reshape(-1)[m], adv.reshape(-1)[m])
        batch = (batch[0], batch[1], batch[2] / (batch[2].std() + 1e-8))
        loss, grads = value_and_grad(params, batch)
        if not FIX or it % 100 == 0:
            audit_gradients(params, grads, batch, probe_rng)
        params, opt = adam_apply(params, grads, opt)
        history.append(rew.sum(0).mean())
    return history


if __name__ == "__main__":
    t0 = time.perf_counter()
    hist = train()
    print(f"final_mean_len={np.mean(hist[-20:]):.1f} time={time.perf_counter() - t0:.2f}s")
