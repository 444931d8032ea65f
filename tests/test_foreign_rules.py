"""The checklist's rules on scripts written here, each planting one bottleneck, and a clean twin.

Each script runs in this process under the instruments ``rlperf profile -- python SCRIPT`` uses
(cProfile, the GC monitor, the forward hooks of rlperf.instruments.evidence), then the foreign
advisor reads them: the planted bottleneck must be named first, at the planted line (the line
marked ``# planted``), with a saving no larger than the script's time; the clean twin gets nothing.
"""

from __future__ import annotations

import cProfile
import pstats
import runpy
import textwrap
import uuid
import threading
from pathlib import Path

import pytest
import torch

from rlperf.instruments import evidence, foreign
from rlperf.instruments.catalogue import CATALOGUE, Finding, finding, reference, section_for
from rlperf.instruments.foreign import ScriptProfile, advise_script, script_steps
from rlperf.instruments.profilers import CallStats, GcMonitor, user_code

ENV = """
import numpy as np

class Env:
    def __init__(self, n=16):
        self.n = n
        self.rng = np.random.default_rng(0)
        self.state = np.zeros((n, 8), np.float32)

    def reset(self):
        self.state[:] = 0
        return self.state.copy()

    def step(self, actions):
        self.state += self.rng.normal(0, 0.1, self.state.shape).astype(np.float32)
        return self.state.copy(), np.ones(self.n, np.float32), np.zeros(self.n, bool)
"""


def advise(tmp_path: Path, body: str, steps: tuple[int, str] | None = None,
           call_cost: float = 0.0, cpu_wait: dict[str, float] | None = None) -> tuple[list[Finding], float, int]:
    """Run ENV + ``body`` as train.py under the instruments; (findings, script seconds, planted line).
    ``steps``: the loop's steps as rlperf profile counted them (else from the env's step calls);
    ``cpu_wait``: what the script's thread waited for a CPU, instead of what it measured."""
    source = textwrap.dedent(ENV) + textwrap.dedent(body)
    script = tmp_path / "train.py"
    script.write_text(source)
    planted = next((i for i, line in enumerate(source.splitlines(), 1) if "# planted" in line), 0)
    own = user_code([tmp_path])
    forwards = evidence.Forwards(own)
    forwards.install(torch)
    monitor, profiler = GcMonitor(), cProfile.Profile()
    sampler = evidence.LineSampler(own, threading.get_ident())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the record below says: two threads on a loaded 2-core box make the torch part 20x slower
    waits = evidence.CpuWait()  # what the script's thread waited for a CPU, as rlperf profile measures it
    try:
        with monitor.running():
            waits.start()
            sampler.start()
            profiler.enable()
            try:
                runpy.run_path(str(script), run_name="__main__")
            finally:
                profiler.disable()
                waited = waits.to_dict()
                sampler.stop()
    finally:
        hooks = forwards.collect() | {"line_samples": sampler.to_dict()}
        if call_cost:
            hooks["profiler_cost"] = {"per_call_s": call_cost}
        torch.set_num_threads(threads)
    calls = CallStats(pstats.Stats(profiler), own=own)
    record = {"system": {"torch_threads": 1},
              "profile": {"load": {"cpus": 2.0, "loadavg_1m": 0.0}, "cpu_wait": cpu_wait if cpu_wait is not None else waited}}
    findings = advise_script(record, calls, monitor.to_dict(), steps or script_steps(record, calls), hooks)
    return findings, ScriptProfile(calls).total, planted


def check_first(findings: list[Finding], total: float, planted: int, finding_id: str) -> Finding:
    assert findings, f"no finding; expected {finding_id}"
    first = findings[0]
    assert first.id == finding_id, [(f.id, f.where) for f in findings]
    assert first.where is not None and first.where.startswith(f"train.py:{planted} ("), (first.where, planted)
    assert first.title == CATALOGUE[finding_id].title and first.reference == reference(finding_id)
    for f in findings:
        assert f.est_saving_s is None or 0 <= f.est_saving_s <= total, (f.id, f.est_saving_s, total)
    return first


LOOP = """
env = Env()
obs = env.reset()
for t in range({steps}):
    obs, reward, done = env.step(None)
"""


def test_a_clean_loop_gets_no_finding(tmp_path: Path) -> None:
    body = """
    import torch
    q = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    opt = torch.optim.Adam(q.parameters())
    env = Env()
    obs = env.reset()
    for t in range(150):
        with torch.no_grad():
            actions = q(torch.from_numpy(obs)).argmax(1)
        obs, reward, done = env.step(actions.numpy())
        loss = q(torch.from_numpy(obs)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if t % 100 == 0:
            print(t, loss.item())
    """
    findings, _, _ = advise(tmp_path, body)
    assert findings == [], [(f.id, f.where, f.est_saving_s) for f in findings]


def test_checkpointing_every_step_is_named_at_the_save(tmp_path: Path) -> None:
    body = """
    import pickle, io
    weights = {i: np.ones(2000) for i in range(40)}
    env = Env()
    for t in range(200):
        env.step(None)
        pickle.dump(weights, io.BytesIO())  # planted
    """
    f = check_first(*advise(tmp_path, body), "checkpointing")
    assert "dump()" in f.evidence and "200 calls" in f.evidence and "one save kept" in f.estimate


def test_rendering_in_the_loop_is_named_at_the_render_call(tmp_path: Path) -> None:
    body = """
    class Drawn(Env):
        def render(self):
            frame = np.zeros((48, 48, 3), np.uint8)
            for y in range(48):
                frame[y, : y] = 255
            return frame.sum()

    env = Drawn()
    for t in range(300):
        env.step(None)
        env.render()  # planted
    """
    check_first(*advise(tmp_path, body), "rendering")


def test_per_pixel_preprocessing_is_named_where_the_loop_calls_it(tmp_path: Path) -> None:
    body = """
    def preprocess(frame):
        out = np.zeros((24, 24), np.float32)
        for y in range(24):
            for x in range(24):
                out[y, x] = frame[2 * y, 2 * x].mean() / 255.0
        return out

    env = Env()
    for t in range(60):
        env.step(None)
        preprocess(np.ones((48, 48, 3)))  # planted
    """
    check_first(*advise(tmp_path, body), "preprocessing")


def test_reward_shaping_in_a_python_loop_is_named(tmp_path: Path) -> None:
    body = """
    def shaped_reward(state, reward):
        shaped = reward.copy()
        for i in range(len(state)):
            for j in range(8):
                shaped[i] += 0.01 * abs(float(state[i, j])) - 0.001
        return shaped

    env = Env(64)
    for t in range(1000):
        state, reward, done = env.step(None)
        shaped_reward(state, reward)  # planted
    """
    check_first(*advise(tmp_path, body), "reward_shaping")


def test_logging_counts_the_reads_that_feed_the_prints(tmp_path: Path) -> None:
    body = """
    import io, torch
    sink = io.StringIO()
    stats = torch.randn(64, 64)
    env = Env()
    for t in range(400):
        env.step(None)
        print(t, stats.mean().item(), stats.std().item(), stats.max().item(), stats.tolist()[:4], file=sink)  # planted
    """
    f = check_first(*advise(tmp_path, body), "logging")
    assert "reads of tensor values" in f.evidence and "1,600 reads" in f.evidence, f.evidence


def test_a_progress_bar_redrawn_with_new_values_every_step_is_logging(tmp_path: Path) -> None:
    body = """
    import io, torch
    from tqdm import tqdm
    stats = torch.randn(64, 64)
    env = Env()
    with tqdm(total=600, file=io.StringIO(), mininterval=0.5) as bar:
        for t in range(600):
            env.step(None)
            bar.set_postfix(mean=stats.mean().item(), top=stats.max().item())  # planted
            bar.update(1)
    """
    f = check_first(*advise(tmp_path, body), "logging")
    assert "600 print/logging/writer/file-write calls" in f.evidence, f.evidence


def test_a_normalizer_looping_over_an_arrays_shape_is_preprocessing_not_shaping(tmp_path: Path) -> None:
    # "shap" counted every x.shape[...] as reward-shaping words: the two kinds tied and the loop was a hot spot
    body = """
    import numpy as np
    mean, var = np.zeros(8), np.ones(8)

    def standardize(x):  # normalize each observation
        out = np.empty(x.shape, np.float32)
        for i in range(x.shape[0]):
            for j in range(x.shape[1]):
                out[i, j] = np.clip((x[i, j] - mean[j]) / np.sqrt(var[j] + 1e-8), -5.0, 5.0)
        return out

    env = Env(16)
    x = env.reset()
    for t in range(150):
        x = standardize(env.step(None)[0])  # planted
    """
    check_first(*advise(tmp_path, body), "preprocessing")


def test_a_sum_tree_walked_in_python_is_replay_work(tmp_path: Path) -> None:
    body = """
    import random
    SIZE = 1 << 12
    tree = [0.0] * (2 * SIZE)

    def tree_update(i, priority):
        node = i + SIZE
        tree[node] = priority
        node //= 2
        while node >= 1:
            tree[node] = tree[2 * node] + tree[2 * node + 1]
            node //= 2

    env = Env()
    for t in range(1200):  # 0.15 s: a neighbour's time slice is a small part of it, not a fifth
        env.step(None)
        for k in range(16):
            tree_update(random.randrange(SIZE), random.random())  # planted
    """
    check_first(*advise(tmp_path, body), "replay_sampling")


def test_a_wrapper_of_a_vector_env_stepped_in_a_rollout_is_not_envs_stepped_one_by_one(tmp_path: Path) -> None:
    # the wrapper's step is called once per time step of the rollout helper, not once per env
    body = """
    import gymnasium as gym
    import numpy as np

    class FrameStack:
        def __init__(self, env):
            self.env = env
        def step(self, actions):
            obs, reward, terminated, truncated, info = self.env.step(actions)
            return np.concatenate([obs, obs], 1), reward, terminated | truncated

    envs = gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync")
    envs.reset(seed=0)
    env = FrameStack(envs)
    def rollout(steps):
        total = 0.0
        for t in range(steps):
            obs, reward, done = env.step(np.zeros(8, np.int64))
            total += float(reward.sum())
        return total

    for it in range(20):
        rollout(64)
    """
    findings, total, _ = advise(tmp_path, body)  # SyncVectorEnv's own loop over its 8 envs may be named
    assert not [f for f in findings if "(rollout)" in f.evidence], [(f.id, f.evidence) for f in findings]
    assert all((f.est_saving_s or 0.0) <= total for f in findings)


LOGGED_METRICS = """
import logging, torch
log = logging.getLogger("train")  # no handler: a log call costs next to nothing
w = torch.randn(512, 512)
env = Env()
for t in range(300):
    state, reward, done = env.step(None)
    if t % EVERY == 0:
        attention = (torch.randn(96, 512) @ w @ w).softmax(-1)  # a metric: computed only to be logged
        peak = attention.max(-1).values.mean().item()
        log.info("step %d attention peak %.3f", t, peak)  # planted
"""


def check_every_step_and_clean(tmp_path: Path, template: str, finding_id: str) -> Finding:
    """``template`` with EVERY = 1 names ``finding_id`` first (returned); with EVERY = 100, no finding."""
    first = check_first(*advise(tmp_path, template.replace("EVERY", "1")), finding_id)
    (tmp_path / "clean").mkdir()
    findings, _, _ = advise(tmp_path / "clean", template.replace("EVERY", "100"))
    assert not findings, [(x.id, x.where) for x in findings]
    return first


def test_logging_counts_the_metrics_computed_only_to_be_logged(tmp_path: Path) -> None:
    # the log call and its .item() read are cheap; the metric computed for it every step is not
    f = check_every_step_and_clean(tmp_path, LOGGED_METRICS, "logging")
    assert "with the values computed only to be logged" in f.evidence, f.evidence
    assert "serve only the logs (train.py:" in f.estimate, f.estimate


def test_a_natively_batched_gymnasium_env_stepped_through_time_is_no_finding(tmp_path: Path) -> None:
    # CartPoleVectorEnv (gymnasium.envs, not gymnasium.vector) steps all its envs in one call: an ES
    # script's rollout stepping it 100 times per call read "steps 506 single envs per call of rollout"
    body = """
    import gymnasium as gym
    envs = gym.make_vec("CartPole-v1", num_envs=64, vectorization_mode="vector_entry_point")
    def rollout():
        envs.reset(seed=0)
        total = 0.0
        for t in range(100):
            obs, r, term, trunc, _ = envs.step(np.zeros(64, dtype=np.int64))
            total += float(r.sum())
        return total
    for generation in range(40):
        rollout()
    """
    findings, _, _ = advise(tmp_path, body)
    assert not [f for f in findings if f.id == "env_backend"], [(f.id, f.where, f.evidence) for f in findings]


CSV_LOGGER = """
import csv, os, tempfile
folder = tempfile.mkdtemp()
env = Env()
rows = []
for t in range(200):
    state, reward, done = env.step(None)
    rows.append({"t": t, "reward": float(reward.mean())})
    if len(rows) >= EVERY:
        with open(os.path.join(folder, "metrics.csv"), "a", newline="") as f:
            csv.DictWriter(f, fieldnames=["t", "reward"]).writerows(rows)
            f.flush()
            os.fsync(f.fileno())  # planted
        rows.clear()
"""


def test_a_homemade_csv_log_forced_to_disk_every_step_is_logging(tmp_path: Path) -> None:
    # a MetricsLogger that appends a row and fsyncs it every step: 44% of a PPO script was no finding
    f = check_every_step_and_clean(tmp_path, CSV_LOGGER, "logging")
    assert "file-write calls" in f.evidence, f.evidence


def test_a_helper_that_only_logs_is_charged_its_whole_time(tmp_path: Path) -> None:
    # the helper computes its metric and logs it: all of its time is the log's, not only the log call's
    body = """
    import logging, torch
    log = logging.getLogger("train")
    w = torch.randn(512, 512)

    def log_attention(step):
        attention = (torch.randn(96, 512) @ w @ w).softmax(-1)
        log.info("step %d attention peak %.3f", step, attention.max(-1).values.mean().item())

    env = Env()
    for t in range(300):
        env.step(None)
        log_attention(t)
    """
    findings, _, _ = advise(tmp_path, body)
    assert findings and findings[0].id == "logging", [(f.id, f.where) for f in findings]
    assert "(log_attention) only logs: its measured time" in findings[0].estimate, findings[0].estimate


SLICED = """
def train(agent, env, writer, steps):
    log_every = 1
    for step in range(steps):
        obs, reward = env.step(agent.act())
        loss = agent.update(obs, reward)          # 6: training, its result logged: not the log's work
        q = agent.q(obs)                          # 7: read below by the update too: not only the log's
        agent.observe(q)
        if step % log_every == 0:                 # 9: the gate around nothing but the log
            stats = {"q": q.mean().item(), "r": reward.std().item()}
            for k, v in stats.items():
                writer.add_scalar(k, v, step)     # 12
            writer.add_scalar("loss", loss, step)  # 13
        history = [reward]                        # 14: never read: no log reads it either
"""


def test_the_log_only_lines_are_the_log_calls_their_values_and_their_gate(tmp_path: Path) -> None:
    from rlperf.instruments.sources import Sources

    file = tmp_path / "loop.py"
    file.write_text(textwrap.dedent(SLICED))
    lines, whole = Sources().log_only((str(file), 2, "train"), [12, 13], impure={"update", "act", "observe"})
    assert lines == [3, 9, 10, 11, 12, 13] and not whole  # log_every read only by the gate
    helper = "def log(writer, x, step):\n    m = x.mean().item()\n    writer.add_scalar('m', m, step)\n"
    (tmp_path / "helper.py").write_text(helper)
    assert Sources().log_only((str(tmp_path / "helper.py"), 1, "log"), [3], impure=set()) == ([2, 3], True)


def test_forwards_with_grad_and_no_backward_are_named_at_the_call_and_not_under_no_grad(tmp_path: Path) -> None:
    body = """
    import torch
    layer = torch.nn.TransformerEncoderLayer(d_model=8, nhead=2, dim_feedforward=32, batch_first=True)
    q = torch.nn.TransformerEncoder(layer, num_layers=3)  # a graph worth not recording: 30-odd ops per forward
    def act(obs):
        return q(torch.from_numpy(obs)[:, None])[:, 0, :2].argmax(1)  # planted

    env = Env(16)
    obs = env.reset()
    for t in range(1200):  # 1.3 s: at 400 steps the whole suite beside hog 2 lost its finding once in 2 runs
        obs, reward, done = env.step(act(obs))
    """
    f = check_first(*advise(tmp_path, body), "autograd_forward")
    assert "1,200 with grad enabled" in f.evidence and "reached 0" in f.evidence
    assert "inference_mode against with grad" in f.estimate
    clean = body.replace("return q(", "with torch.no_grad():\n            return q(")
    assert clean != body
    (tmp_path / "clean").mkdir()
    findings, _, _ = advise(tmp_path / "clean", clean)
    assert not [f for f in findings if f.id == "autograd_forward"], [(f.id, f.where) for f in findings]


def test_one_sample_forwards_are_named_with_a_measured_batch_saving(tmp_path: Path) -> None:
    body = """
    import torch
    q = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    env = Env(32)
    obs = torch.from_numpy(env.reset())
    for t in range(240):  # 0.2 s: at 60 steps (0.05 s) a busy runner's CPU waits outweighed it
        with torch.no_grad():
            actions = [q(obs[i]).argmax() for i in range(32)]  # planted
        obs = torch.from_numpy(env.step(actions)[0])
    """
    f = check_first(*advise(tmp_path, body), "small_batch")
    assert "32 per step" in f.evidence and "32 stacked samples" in f.estimate


LIBRARY = """
import torch

def learn(q, env, steps):  # a library's loop: acts on one observation, trains on batches of 64
    opt = torch.optim.SGD(q.parameters(), lr=1e-3)
    obs = torch.from_numpy(env.reset())
    for t in range(steps):
        with torch.no_grad():
            action = q(obs[0]).argmax()
        obs = torch.from_numpy(env.step(action)[0])
        batch = obs.repeat(4, 1)
        with torch.no_grad():
            target = q(batch).max(1).values
        loss = (q(batch).max(1).values - target).pow(2).mean() + q(batch).mean() * 0
        opt.zero_grad()
        loss.backward()
        opt.step()
"""


def test_one_line_calling_a_library_that_acts_on_one_sample_and_trains_on_batches_is_not_small_batch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # every module call inside model.learn() is the one line's: one fed a single observation per
    # step (nothing to batch with one env) and three fed batches were all read as one-sample forwards
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "agentlib.py").write_text(textwrap.dedent(LIBRARY))
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    body = """
    import torch
    import agentlib

    q = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    agentlib.learn(q, Env(1), 400)
    """
    (tmp_path / "proj").mkdir()
    findings, _, _ = advise(tmp_path / "proj", body)
    assert not [f for f in findings if f.id == "small_batch"], [(f.id, f.where, f.evidence) for f in findings]


def test_polling_sleeps_are_busy_waiting(tmp_path: Path) -> None:
    body = """
    import time
    env = Env()
    ready = 0
    for t in range(100):
        env.step(None)
        while ready < t:
            time.sleep(0.0005)  # planted
            ready += 0.5
    """
    check_first(*advise(tmp_path, body), "busy_wait")


def test_many_updates_per_loop_iteration_are_not_per_env_step(tmp_path: Path) -> None:
    # a learner fed by an actor thread (its env steps unseen): 8 updates per iteration of its loop are
    # no evidence of 8 per env step; the same loop stepping an env is
    body = """
    import torch
    q = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(q.parameters(), lr=0.01)
    def learn():
        loss = q(torch.randn(32, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    env = Env()
    for it in range(60):
        if STEP:
            env.step(None)
        for _ in range(8):  # planted
            learn()
    """
    basis = "iterations of the loop in train.py:30 (<module>) (2 functions it calls ran 60 times each)"
    findings, _, _ = advise(tmp_path, body.replace("STEP", "False"), steps=(60, basis))
    assert not [f for f in findings if f.id == "update_ratio"], [(f.id, f.evidence) for f in findings]
    (tmp_path / "env").mkdir()
    check_first(*advise(tmp_path / "env", body.replace("STEP", "True")), "update_ratio")


QUEUE_LEARNER = """
import queue, threading, time
q = queue.Queue(64)
def actor():
    env = Env()
    for t in range(300):
        state, reward, done = env.step(None)
        time.sleep(0.001)  # the env's own pace (a simulator, a robot)
        q.put(state)
    q.put(None)
threading.Thread(target=actor, daemon=True).start()
env = Env()  # the loop's steps: one per transition the learner takes
while True:
    while SPIN and q.empty():  # planted
        pass
    item = q.get()
    if item is None:
        break
    env.step(None)
"""


def test_a_thread_joined_once_at_the_end_is_not_busy_waiting(tmp_path: Path) -> None:
    # a clean A2C script whose rollout thread finished its last rollout while main() joined it: beside
    # two busy processes that join() took 1 s, 20% of the script, and was named a busy wait (10 calls
    # from 2 sites: the thread's start() and its join()); a spin makes many calls from one place
    body = """
    import threading, time
    stop = threading.Event()
    def rollouts():
        env = Env()
        while not stop.is_set():
            env.step(None)
        end = time.perf_counter() + 0.4  # the last rollout, finished after the stop
        while time.perf_counter() < end:
            pass
    worker = threading.Thread(target=rollouts)
    worker.start()
    env = Env()
    for t in range(300):
        env.step(None)
        if t % 40 == 0:
            time.sleep(0.001)  # the learner's own pace, now and then
    stop.set()
    worker.join()
    """
    findings, _, _ = advise(tmp_path, body)
    assert not [f for f in findings if f.id == "busy_wait"], [(f.id, f.where, f.evidence) for f in findings]


def test_a_learner_blocked_on_its_actors_queue_is_not_busy_waiting(tmp_path: Path) -> None:
    # the fixed twin of a SAC learner that spun on q.empty(): its blocking q.get() waits inside
    # threading's Condition.wait, which counted as a lock wait (a finding on the fix itself)
    findings, _, _ = advise(tmp_path, QUEUE_LEARNER.replace("SPIN", "False"))
    assert not [f for f in findings if f.id == "busy_wait"], [(f.id, f.where, f.evidence) for f in findings]
    (tmp_path / "spin").mkdir()
    check_first(*advise(tmp_path / "spin", QUEUE_LEARNER.replace("SPIN", "True")), "busy_wait")
    # a spin's time is the wait's, not net of cProfile's cost per call (millions of empty() calls at
    # 0.34 us each left a SAC learner's spin at zero)
    (tmp_path / "costly").mkdir()
    check_first(*advise(tmp_path / "costly", QUEUE_LEARNER.replace("SPIN", "True"), call_cost=2e-6), "busy_wait")


EVAL_ENV = """
import gymnasium as gym
stats = np.random.default_rng(0).normal(size=(200_000, 4)).astype(np.float32)
def make_eval_env():
    env = gym.wrappers.NormalizeObservation(gym.make("CartPole-v1"))
    env.obs_rms.update(stats)  # primed from the dataset: the costly part of the build
    return env
def evaluate(env=None):
    env = env or make_eval_env()
    env.reset(seed=0)
    for _ in range(20):
        env.step(0)
import torch
q = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
opt = torch.optim.Adam(q.parameters())
eval_env = None if REBUILD else make_eval_env()
env = Env()
obs = env.reset()
for t in range(240):
    obs, reward, done = env.step(None)
    loss = q(torch.from_numpy(obs)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if t % 20 == 0:
        evaluate(eval_env)  # planted
"""


def test_a_numpy_networks_target_copied_every_update_is_a_target_copy(tmp_path: Path) -> None:
    # a DQN in NumPy (no torch optimizer to count updates by): copy.deepcopy of its weights every
    # update was "a hot spot no rule knows"
    body = """
    import copy
    net = {"w1": np.ones((256, 256)), "w2": np.ones((256, 64)), "history": [np.float64(i) for i in range(2000)]}
    env = Env()
    for t in range(300):
        state, reward, done = env.step(None)
        net["w1"] -= 1e-3 * state[:, :1].mean()
        if t % EVERY == 0:
            target = copy.deepcopy(net)  # planted
    """
    check_first(*advise(tmp_path, body.replace("EVERY", "1")), "target_copy")
    (tmp_path / "clean").mkdir()
    findings, _, _ = advise(tmp_path / "clean", body.replace("EVERY", "100"))
    assert not [f for f in findings if f.id == "target_copy"], [(f.id, f.evidence) for f in findings]


def test_an_evaluation_episode_is_not_envs_stepped_one_by_one(tmp_path: Path) -> None:
    # one env stepped through an episode, 20 steps a call: "steps 20 single envs per call of evaluate";
    # a loop over a list of envs is (the second script)
    body = """
    import gymnasium as gym
    eval_env = gym.make("CartPole-v1")
    def evaluate():
        eval_env.reset(seed=0)
        for _ in range(20):
            eval_env.step(0)
    env = Env()
    for t in range(240):
        env.step(None)
        if t % 20 == 0:
            evaluate()
    """
    findings, _, _ = advise(tmp_path, body)
    assert not [f for f in findings if f.id == "env_backend"], [(f.id, f.where, f.evidence) for f in findings]
    (tmp_path / "list").mkdir()
    # envs built and reset once, each stepped every iteration: their steps are most of the script (resetting
    # the twenty at every call, as the evaluation does, left their steps at 35%: a margin of 5% over the
    # rule's 30% cut-off, which one preemption of a 0.2 s script beside busy processes took away)
    listed = body.replace("eval_env = gym.make(\"CartPole-v1\")", "envs = [gym.make(\"CartPole-v1\") for _ in range(20)]\n"
                          "    [e.reset(seed=0) for e in envs]")
    listed = listed.replace("        eval_env.reset(seed=0)\n", "").replace(
        "for _ in range(20):\n            eval_env.step(0)", "for e in envs:\n            e.step(0)")
    listed = listed.replace("if t % 20 == 0:", "if True:")
    assert "for e in envs" in listed and "if True:" in listed and "eval_env" not in listed
    findings, _, _ = advise(tmp_path / "list", listed)
    assert [f for f in findings if f.id == "env_backend"], [(f.id, f.where, f.evidence) for f in findings]


def test_envs_that_draw_a_frame_in_their_reset_are_rendering_first_and_not_the_vector_env_s_cost(tmp_path: Path) -> None:
    """A SyncVectorEnv of envs whose reset draws a frame (reached every episode by autoreset): the steps hold
    the drawing, and the env-backend saving counted it as per-env dispatch (outranking the rendering)."""
    body = """
    import gymnasium as gym

    class Reacher(gym.Env):
        observation_space = gym.spaces.Box(-1, 1, (4,))
        action_space = gym.spaces.Discrete(2)

        def __init__(self):
            self.t = 0
            self.canvas = np.zeros((48, 48))

        def render(self):
            for i in range(48):
                for j in range(48):
                    self.canvas[i, j] = (i * j + self.t) % 7
            return self.canvas

        def reset(self, seed=None, options=None):
            self.t = 0
            self.render()  # planted
            return np.zeros(4, np.float32), {}

        def step(self, action):
            self.t += 1
            arm = np.linspace(0, 1, 64) * (self.t + action)
            return np.array([np.sin(arm).sum(), np.cos(arm).sum(), 0, 0], np.float32), 1.0, self.t >= 5, False, {}

    envs = gym.vector.SyncVectorEnv([Reacher for _ in range(8)])
    envs.reset(seed=0)
    for t in range(600):
        envs.step(np.zeros(8, np.int64))
    """
    findings, total, planted = advise(tmp_path, body)
    f = check_first(findings, total, planted, "rendering")
    backend = [x for x in findings if x.id == "env_backend"]
    # the steps' time less the drawing (beside busy processes 0.27 s of 1.42 s, rendering's 0.34 s)
    assert not backend or ("drawing frames" in backend[0].evidence and (backend[0].est_saving_s or 0) < (
        f.est_saving_s or 0)), [(x.id, x.est_saving_s, x.evidence) for x in backend]


def test_an_eval_env_built_again_at_every_evaluation_is_env_construction(tmp_path: Path) -> None:
    # an offline-RL script rebuilt its eval env (wrappers, a normalizer primed from its dataset) at every
    # evaluation: 39% of the script, no finding (its make() calls themselves took next to nothing)
    f = check_first(*advise(tmp_path, EVAL_ENV.replace("REBUILD", "True")), "env_reset")
    assert "make_eval_env()" in f.evidence, f.evidence
    (tmp_path / "once").mkdir()
    findings, _, _ = advise(tmp_path / "once", EVAL_ENV.replace("REBUILD", "False"))
    assert not findings, [(x.id, x.where, x.evidence) for x in findings]


def test_resetting_every_step_is_named(tmp_path: Path) -> None:
    body = """
    class Slow(Env):
        def reset(self):
            self.state[:] = np.linalg.inv(np.eye(150) + 0.01).sum()
            return self.state.copy()

    env = Slow()
    for t in range(150):
        env.step(None)
        env.reset()  # planted
    """
    check_first(*advise(tmp_path, body), "env_reset")


def test_tensors_rebuilt_from_host_arrays_every_step_are_transfers(tmp_path: Path) -> None:
    body = """
    import torch
    history = np.random.default_rng(0).standard_normal((200_000, 8)).astype(np.float32)
    env = Env()
    for t in range(150):
        env.step(None)
        table = torch.tensor(history)  # planted
    """
    check_first(*advise(tmp_path, body), "device_transfer")


def test_a_hot_spot_no_rule_knows_is_never_a_clean_bill(tmp_path: Path) -> None:
    body = """
    import math

    def mystery(t):
        return sum(math.sin(i * t) for i in range(3000))

    env = Env()
    for t in range(150):
        env.step(None)
        mystery(t)  # planted
    """
    findings, total, planted = advise(tmp_path, body)
    assert [f.id for f in findings] == ["hot_spot"], [(f.id, f.where) for f in findings]
    f = findings[0]
    assert f.where == f"train.py:{planted} (<module>)" and "your function mystery" in f.evidence
    assert f.est_saving_s is not None and f.est_saving_s <= total and "at most" in f.estimate


CATALOGUE_DOC = Path(__file__).resolve().parents[1] / "rlperf" / "docs" / "bottlenecks.md"


def test_the_catalogue_covers_the_checklist_with_sections_and_references() -> None:
    checklist = ["replay_sampling", "host_copy", "update_ratio", "target_copy", "autograd_forward", "small_batch",
                 "device_transfer", "env_reset", "rendering", "reward_shaping", "preprocessing", "gc_pauses", "logging",
                 "checkpointing", "busy_wait", "threads", "hot_spot"]
    assert set(checklist) <= set(CATALOGUE)
    assert section_for("host_copy") == 1 and section_for("logging") == 9 and section_for("rendering") is None
    assert section_for("no_such_id") is None
    assert reference("target_copy") == "docs/bottlenecks.md §7 (rlperf explain 7)"
    assert reference("checkpointing") == "docs/bottlenecks.md (rlperf explain checkpointing)"
    sections = {int(line.split("§")[1].split()[0]) for line in CATALOGUE_DOC.read_text().splitlines()
                if line.startswith("## §")}
    assert {b.section for b in CATALOGUE.values() if b.section is not None} <= sections
    for b in CATALOGUE.values():
        assert (b.knob is None) == (b.slow is None) or b.id == "small_batch_gpu"


@pytest.mark.parametrize("finding_id", sorted(CATALOGUE))
def test_every_catalogue_entry_reads_as_a_sentence(finding_id: str) -> None:
    b = CATALOGUE[finding_id]
    assert b.title and b.cost and b.fix and b.expected_gain and not b.fix.endswith(".")


def test_an_env_built_every_episode_is_an_env_reset_at_the_construction(tmp_path: Path) -> None:
    body = """
    class Built(Env):
        def __init__(self, n=16):
            super().__init__(n)
            self.table = np.linalg.inv(np.eye(120) + 0.01)

    for episode in range(40):
        env = Built()  # planted
        env.reset()
        for t in range(5):
            env.step(None)
    """
    check_first(*advise(tmp_path, body), "env_reset")


def test_one_sample_forwards_through_a_helper_point_at_the_loop_over_samples(tmp_path: Path) -> None:
    body = """
    import torch
    net = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))

    def policy(x):
        return net(x).argmax(-1)

    env = Env(32)
    obs = torch.from_numpy(env.reset())
    for t in range(240):  # 0.3 s: at 60 steps (0.07 s) a busy runner's CPU waits outweighed it
        actions = []
        with torch.no_grad():
            for i in range(32):
                actions.append(policy(obs[i : i + 1]))  # planted
        obs = torch.from_numpy(env.step(actions)[0])
    """
    check_first(*advise(tmp_path, body), "small_batch")


def test_a_function_called_under_another_name_is_found_at_its_call(tmp_path: Path) -> None:
    body = """
    def bonus_loops(state):
        total = 0.0
        for row in state:
            for value in row:
                total += 0.01 * abs(float(value))
        return total

    def bonus_fast(state):
        return 0.01 * float(np.abs(state).sum())

    def main(fixed=False):
        bonus = bonus_fast if fixed else bonus_loops
        env = Env(64)
        shaped = bonus(env.reset())
        for t in range(1000):
            state, reward, done = env.step(None)
            shaped = reward + bonus(state)  # planted
        return shaped

    main()
    """
    check_first(*advise(tmp_path, body), "reward_shaping")


HOT_HELPER = """
def spread(points):
    return float(np.linalg.svd(points, compute_uv=False).sum())

points = np.random.default_rng(0).standard_normal((300, 300))
env = Env()
for t in range(60):
    env.step(None)
    spread(points)  # planted
"""


@pytest.mark.parametrize("own_module", [False, True], ids=["alone", "importing-a-module-of-its-own"])
def test_a_helper_whose_one_library_call_holds_the_loop_is_a_hot_spot(tmp_path: Path, monkeypatch,
                                                                       own_module: bool) -> None:
    # a module of the script's own imported while it runs makes importlib a caller of exec, as runpy
    # is for the script itself: the script's top level (the longest module exec ran) is still no import
    head = ""
    if own_module:
        lib = tmp_path / "lib"
        lib.mkdir()
        name = f"fresh_{uuid.uuid4().hex}"
        (lib / f"{name}.py").write_text("VALUE = 1\n")
        monkeypatch.syspath_prepend(str(lib))
        head = f"import {name}\n"
    f = check_first(*advise(tmp_path, head + HOT_HELPER), "hot_spot")
    assert "your function spread" in f.evidence


def test_a_method_is_found_at_the_call_on_its_own_object_not_at_a_namesake(tmp_path: Path) -> None:
    body = """
    import random

    class Space:
        def sample(self):
            return random.randrange(2)

    class TupleReplay:
        def __init__(self):
            self.memory = [(np.ones(8, np.float32), float(i)) for i in range(2000)]

        def sample(self, n):
            batch = random.sample(self.memory, n)
            return np.array([t[0] for t in batch]), np.array([t[1] for t in batch])

    space, rb = Space(), TupleReplay()
    env = Env()
    for t in range(300):
        action = space.sample()
        env.step(action)
        obs, rew = rb.sample(256)  # planted
    """
    check_first(*advise(tmp_path, body), "replay_sampling")


def test_the_thread_count_is_named_where_the_count_the_script_ran_with_was_set(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from rlperf.instruments.foreign import Sources, _setter_where

    script = tmp_path / "train.py"
    script.write_text("import torch\n\ndef main(fast):\n    if fast:\n        torch.set_num_threads(1)\n"
                      "    else:\n        torch.set_num_threads(16)\n")
    p = SimpleNamespace(sources=Sources(), where=lambda caller, names: "first call")
    assert _setter_where(p, (str(script), 3, "main"), 16) == "train.py:7 (main)"  # type: ignore[arg-type]
    assert _setter_where(p, (str(script), 3, "main"), 4) == "first call"  # type: ignore[arg-type]


def test_a_vectorized_function_whose_loop_runs_a_few_times_is_not_a_hot_spot(tmp_path: Path) -> None:
    """The line samples put its time on its array lines, not in its loop over the few colliding pairs."""
    body = """
    import time

    def physics(pos, vel):
        iu, ju = np.triu_indices(60, 1)
        dist = np.sqrt(((pos[ju] - pos[iu]) ** 2).sum(1))
        for i in np.nonzero(dist < 0.02)[0][:3]:
            vel[iu[i]] *= -1
        pos += 0.01 * vel

    rng = np.random.default_rng(0)
    pos, vel = rng.uniform(0, 1, (60, 2)), rng.standard_normal((60, 2))
    env = Env()
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        env.step(None)
        physics(pos, vel)
    """
    findings, _, _ = advise(tmp_path, body)
    assert findings == [], [(f.id, f.where, f.est_saving_s) for f in findings]


def test_the_line_sampler_counts_the_line_a_thread_is_on(tmp_path: Path) -> None:
    script = tmp_path / "busy.py"
    script.write_text("import time\n\ndef spin(end):\n    while time.perf_counter() < end:\n        pass\n\n"
                      "spin(time.perf_counter() + 0.5)\n")
    sampler = evidence.LineSampler(user_code([tmp_path]), threading.get_ident())
    sampler.start()
    try:
        runpy.run_path(str(script))
    finally:
        sampler.stop()
    lines = {(Path(f).name, line, fn): (inner, incl, wall) for f, line, fn, inner, incl, _, wall
             in sampler.to_dict()["lines"]}
    spin = sum(incl for (_, line, fn), (_, incl, _) in lines.items() if fn == "spin" and line in (4, 5))
    caller = lines.get(("busy.py", 7, "<module>"), (0, 0, 0))
    assert spin >= 0.8 * sampler.cpu_s / evidence.SAMPLE_S > 10, (lines, sampler.samples)
    assert caller[1] >= spin and caller[0] <= 0.2 * spin  # on the stack, but not the innermost line of your code
    assert sampler.samples >= 0.8 * 0.5 / evidence.SAMPLE_S and caller[2] >= 0.8 * 0.5 / evidence.SAMPLE_S



METRIC = """
import torch

def spread(states):
    return (torch.cdist(states, states) < 0.5).float().mean().item()

states = torch.randn(600, 8)
env = Env()
history = []
for t in range(80):
    obs, reward, done = env.step(None)
    states = torch.roll(states, 1, 0)
    {line}
"""


def test_work_every_step_whose_result_is_only_collected_is_a_hot_spot(tmp_path: Path) -> None:
    f = check_first(*advise(tmp_path, METRIC.format(line="history.append(spread(states))  # planted")), "hot_spot")
    assert "only collects" in f.evidence, f.evidence


def test_the_same_work_feeding_the_next_step_is_the_loop_s_own(tmp_path: Path) -> None:
    findings, _, _ = advise(tmp_path, METRIC.format(line="states = states * (1 + spread(states))"))
    assert findings == [], [(f.id, f.where, f.est_saving_s) for f in findings]


def test_a_library_call_whose_result_the_next_step_is_drawn_from_is_the_loop_s_own(tmp_path: Path) -> None:
    """A prioritized replay's prefix sums rebuilt by one np.cumsum per sample: most of the script in one library
    call of your function, whose result picks the indices the loop updates next; dropped each step, a hot spot."""
    body = """
    prio = np.random.rand(400_000)

    def prefix():
        return np.cumsum(prio)

    for t in range(150):
        idx = np.searchsorted(prefix(), np.random.rand(64) * prio.sum())
        prio[np.minimum(idx, prio.size - 1)] += 0.1
    """
    findings, total, _ = advise(tmp_path, body)
    assert findings == [], [(f.id, f.where, f.est_saving_s, total) for f in findings]
    dropped = body.replace("idx = np.searchsorted(prefix(),", "prefix()  # planted\n        idx = np.searchsorted(prio,")
    assert dropped != body
    (tmp_path / "dropped").mkdir()
    check_first(*advise(tmp_path / "dropped", dropped), "hot_spot")


def test_a_loop_that_imports_a_call_heavy_module_keeps_its_own_time(tmp_path: Path) -> None:
    """cProfile's cost is left out for the loop's calls, not for the calls made while importing (their
    time is left out whole): the loop's time stays the loop's, and nothing in it is a finding."""
    (tmp_path / "heavy_import.py").write_text("def f():\n    return 1\n\nfor _ in range(400_000):\n    f()\n")
    body = f"""
    import sys
    sys.path.insert(0, {str(tmp_path)!r})
    env = Env()
    for t in range(3000):
        env.step(None)
        if t == 5:
            import heavy_import
    """
    findings, total, _ = advise(tmp_path, body)
    assert findings == [], [(f.id, f.where, f.est_saving_s) for f in findings]
    assert total > 0.005, total


FUNCTIONAL = """
import torch

def {name}(state, out):
    for k in range({n}):
        out[2 * k:2 * k + 2] = state[k]
    return out

q = torch.nn.Sequential(torch.nn.Linear(2 * {n}, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
opt = torch.optim.Adam(q.parameters())
state, out = np.ones(({n}, 2)), np.zeros(2 * {n}, np.float32)
for t in range(300):
    obs = torch.from_numpy({name}(state, out))  # planted
    loss = q(obs).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_functional_env_s_own_loop_is_the_env_s_cost_unless_it_dominates(tmp_path: Path) -> None:
    """A Python loop of about a third of the script: in the env (env_observe) it is the env's work, as
    in an Env's step; in the agent's observation handling it is preprocessing. (n=900 was a third on a
    Xeon and 37-41% on an EPYC, against the env's 40%.)"""
    findings, total, _ = advise(tmp_path, FUNCTIONAL.format(name="env_observe", n=700))
    assert findings == [], [(f.id, f.where, f.est_saving_s, total) for f in findings]
    f = check_first(*advise(tmp_path, FUNCTIONAL.format(name="preprocess_obs", n=1400)), "preprocessing")
    assert "Python loop" in f.evidence


def test_a_share_that_waits_for_a_cpu_could_have_made_is_no_finding(tmp_path: Path) -> None:
    """cProfile charges a call the wall time it took, so on a busy machine a wait for a CPU lands on
    whatever call was running: a function of about a fifth of the script's work stalled once for as
    long as the rest took (a sleep stands for the scheduler's wait, and the record says the thread
    waited that long, once). With the wait measured, its share is not read as work; without, it is."""
    # the stall inside the loop, on its first pass: the loop's own time, as a wait the scheduler made would be
    stalled = FUNCTIONAL.replace("    for k in range({n}):\n", "    for k in range({n}):\n        if not stalls:\n"
                                 "            stalls.append(time.sleep({stall}))\n").replace(
                                     "import torch", "import time\nimport torch\nstalls = []")
    # n=300: a fifth of the work, clear of the rule's threshold on a quiet run (at 500 a quiet run read 26%)
    quiet, total, _ = advise(tmp_path, FUNCTIONAL.format(name="preprocess_obs", n=300, stall=0))
    assert quiet == [], [(f.id, f.est_saving_s, total) for f in quiet]
    stall = 1.5 * total
    (tmp_path / "told").mkdir()
    told, _, _ = advise(tmp_path / "told", stalled.format(name="preprocess_obs", n=300, stall=stall),
                        cpu_wait={"wait_s": stall, "slices": 1})
    assert told == [], [(f.id, f.est_saving_s) for f in told]
    (tmp_path / "untold").mkdir()
    untold, _, _ = advise(tmp_path / "untold", stalled.format(name="preprocess_obs", n=300, stall=stall),
                          cpu_wait={})
    assert untold and untold[0].where.startswith("train.py:"), [(f.id, f.est_saving_s) for f in untold]


def test_forwards_with_grad_that_cost_nothing_measurable_are_no_finding(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Grad mode on for selection and no backward reads the graphs, but the micro-benchmark finds running
    them under inference_mode 2% faster with its repeats overlapping (CleanRL's dqn.py: 1.6%, inside the
    noise): no finding. The benchmark's figures are fixed here; how the forwards ran is measured."""
    bench = {"slow_s": 1.0e-3, "fast_s": 0.98e-3, "slow_range_s": [0.97e-3, 1.05e-3],
             "fast_range_s": [0.95e-3, 1.02e-3], "repeats": 5}
    monkeypatch.setattr(evidence.Forwards, "_bench_no_grad", lambda self, site: bench)
    body = """
    import torch
    q = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 2))
    env = Env(64)
    obs = env.reset()
    for t in range(300):
        obs, reward, done = env.step(q(torch.from_numpy(obs)).argmax(1))
    """
    findings, _, _ = advise(tmp_path, body)
    assert findings == [], [(f.id, f.where, f.est_saving_s) for f in findings]
    bench.update(fast_s=0.5e-3, fast_range_s=[0.45e-3, 0.55e-3])  # half the time: a finding
    (tmp_path / "slower").mkdir()
    findings, _, _ = advise(tmp_path / "slower", body)
    assert [f.id for f in findings] == ["autograd_forward"], [(f.id, f.est_saving_s) for f in findings]


LOADER_REPLAY = """
import torch
from torch.utils.data import DataLoader, TensorDataset

data = TensorDataset(torch.randn(20000, 8), torch.randint(0, 2, (20000,)))
q = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
opt = torch.optim.SGD(q.parameters(), lr=0.01)

def learn(obs, actions):
    loss = q(obs).gather(1, actions[:, None]).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_a_dataloader_made_for_every_batch_is_replay_sampling(tmp_path: Path) -> None:
    """``next(iter(DataLoader(replay, shuffle=True)))`` per update: a fresh iterator, a draw over the whole
    buffer and an item-by-item read for each batch."""
    body = LOADER_REPLAY + textwrap.dedent("""
    def sample(batch):
        return next(iter(DataLoader(data, batch_size=batch, shuffle=True)))

    for t in range(300):
        learn(*sample(64))  # planted
    """)
    f = check_first(*advise(tmp_path, body), "replay_sampling")
    assert "DataLoader iterator for every batch" in f.evidence and "300 iterators" in f.evidence


def test_an_epoch_over_one_dataloader_is_not_replay_sampling(tmp_path: Path) -> None:
    body = LOADER_REPLAY + textwrap.dedent("""
    loader = DataLoader(data, batch_size=64, shuffle=True)
    for epoch in range(2):
        for obs, actions in loader:
            learn(obs, actions)
    """)
    findings, total, _ = advise(tmp_path, body)
    assert total > 0.1 and "replay_sampling" not in [f.id for f in findings], [(f.id, f.evidence) for f in findings]


def test_a_batch_built_one_tensor_per_stored_element_is_replay_sampling_without_a_visible_draw(tmp_path: Path) -> None:
    """The indices come in drawn elsewhere (numpy's Generator.integers is a Cython method cProfile does not
    record): the per-element tensors and their stack are the evidence, named at the comprehension."""
    body = """
    import torch
    obs_store = np.random.rand(4096, 8).astype(np.float32)
    act_store = np.random.rand(4096, 2).astype(np.float32)

    def draw(idx):
        fields = []
        for arr in (obs_store, act_store):
            fields.append(torch.stack([torch.tensor(arr[i]) for i in idx]))  # planted
        return fields

    env = Env()
    rng = np.random.default_rng(0)
    for t in range(120):
        env.step(None)
        o, a = draw(rng.integers(0, 4096, 128))
        (o.sum() + a.sum()).item()
    """
    f = check_first(*advise(tmp_path, body), "replay_sampling")
    assert "element by element" in f.evidence


def test_a_method_walking_a_tree_is_replay_work_by_its_class_name(tmp_path: Path) -> None:
    """A sum tree's update method called ``set``: the words of its class say what it walks."""
    body = """
    import random
    SIZE = 1 << 12

    class SegmentTree:
        def __init__(self):
            self.nodes = [0.0] * (2 * SIZE)

        def set(self, i, value):
            pos = i + SIZE
            self.nodes[pos] = value
            pos //= 2
            while pos >= 1:
                self.nodes[pos] = self.nodes[2 * pos] + self.nodes[2 * pos + 1]
                pos //= 2

    tree = SegmentTree()
    env = Env()
    for t in range(3000):  # 0.25 s: at 400 steps (0.02-0.05 s) a busy machine's waits outweighed it, 1 in 8
        env.step(None)
        for k in range(16):
            tree.set(random.randrange(SIZE), random.random())  # planted
    """
    check_first(*advise(tmp_path, body), "replay_sampling")


def test_a_dataloader_reading_your_dataset_item_by_item_is_replay_sampling(tmp_path: Path) -> None:
    """Each batch: one __getitem__ call per item (a dict of rows) and default_collate stacking them again. Eight
    epochs (0.6 s): at two (0.17 s) the CPU waits of a busy machine left the fetches' share too uncertain to clear."""
    body = """
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Transitions(Dataset):
        def __init__(self, n):
            self.t = {k: torch.randn(n, 8) for k in ("obs", "next_obs", "act", "rew")}
            self.n = n

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            return {k: v[i] for k, v in self.t.items()}  # planted

    q = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(q.parameters(), lr=0.01)
    loader = DataLoader(Transitions(12800), batch_size=128, shuffle=True)
    for epoch in range(8):
        for batch in loader:
            loss = (q(batch["obs"]) - batch["rew"][:, :1]).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    """
    f = check_first(*advise(tmp_path, body), "replay_sampling")
    assert "item by item" in f.evidence and "128 per batch" in f.evidence


def test_a_check_run_after_every_update_is_a_hot_spot(tmp_path: Path) -> None:
    """A function that only asserts (a finite-difference gradient check), called every iteration, holding
    most of the script through the functions it calls: no Python loop of its own holds the time."""
    body = """
    W = np.random.rand(64, 64)

    def loss(params, x):
        return float(np.tanh(x @ params["w"]).sum())

    def check_gradients(params, grads, x, h=1e-5):
        for _ in range(8):
            i, j = np.random.randint(64), np.random.randint(64)
            plus = {k: v.copy() for k, v in params.items()}
            minus = {k: v.copy() for k, v in params.items()}
            plus["w"][i, j] += h
            minus["w"][i, j] -= h
            numeric = (loss(plus, x) - loss(minus, x)) / (2 * h)
            assert abs(numeric - grads["w"][i, j]) < 1e9

    params = {"w": W}
    env = Env()
    x = np.random.rand(256, 64)
    for t in range(150):
        env.step(None)
        grads = {"w": np.zeros_like(W)}
        check_gradients(params, grads, x)  # planted
    """
    findings, _, planted = advise(tmp_path, body)
    assert [f.id for f in findings] == ["hot_spot"], [(f.id, f.where) for f in findings]
    assert findings[0].where == f"train.py:{planted} (<module>)" and "check_gradients" in findings[0].evidence


def test_a_numba_compiled_loop_is_not_a_python_loop(tmp_path: Path) -> None:
    """An njit function's loops run compiled, though numba's dispatcher reports the call to cProfile under
    the function's own key (all of it 'own time'): neither a Python loop over elements nor a hot spot."""
    pytest.importorskip("numba")
    body = """
    import numba

    @numba.njit(cache=False)
    def simulate(thetas, horizon):
        out = np.zeros(thetas.shape[0])
        for p in range(thetas.shape[0]):
            x = 0.0
            for t in range(horizon):
                for i in range(thetas.shape[1]):
                    x += np.tanh(thetas[p, i] * x + 0.1)
            out[p] = x
        return out

    rng = np.random.default_rng(0)
    for it in range(300):
        scores = simulate(rng.standard_normal((256, 8)), 100)
    """
    # (numba's compilation, a library call made once, may leave a finding of its own: not this test's)
    findings, _, _ = advise(tmp_path, body)
    named = [f for f in findings if "simulate" in f.evidence or "(simulate)" in (f.where or "")]
    assert named == [], [(f.id, f.where, f.evidence) for f in named]


def test_a_td_target_written_per_element_over_a_network_s_outputs_is_not_reward_shaping(tmp_path: Path) -> None:
    """The loop reads the rewards, but with the target network's outputs passed in: the update's own
    target computed per element (a hot spot), not a reward shaped from the env's state."""
    body = """
    import torch
    q = torch.nn.Linear(8, 4)

    def td_targets(rewards, next_q, gamma):
        out = torch.empty(len(rewards))
        for i in range(len(rewards)):
            out[i] = rewards[i] + gamma * next_q[i].max()
        return out

    env = Env(128)
    for t in range(60):
        obs, reward, done = env.step(None)
        with torch.no_grad():
            y = td_targets(torch.from_numpy(reward), q(torch.from_numpy(obs)), 0.99)  # planted
    """
    findings, _, planted = advise(tmp_path, body)
    assert [f.id for f in findings] == ["hot_spot"], [(f.id, f.where) for f in findings]
    assert findings[0].where == f"train.py:{planted} (<module>)" and "td_targets" in findings[0].evidence


def test_a_saving_is_a_share_of_the_script_s_own_time_not_of_its_waits_for_a_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Beside busy processes a script's wall time grows by what its thread waits for a CPU; its
    bottleneck's measured saving does not. A saving of 6% of the script's own time, in a run that
    waited for a CPU twice as long as it ran, is a finding (4% of the wall time would drop it); the
    same saving in a quiet run of the same wall time, 2% of it, is not."""
    profiler = cProfile.Profile()
    profiler.enable()
    sum(i * i for i in range(100_000))
    profiler.disable()
    calls = CallStats(pstats.Stats(profiler), own=lambda file: False)
    total = ScriptProfile(calls).total
    saving = 0.06 * total / 3
    rule = lambda ev: finding("checkpointing", "a save every step", saving, "measured", where="train.py:9 (<module>)")  # noqa: E731
    monkeypatch.setattr(foreign, "SCRIPT_RULES", [rule])

    def advised(waited: float) -> list[str]:
        record = {"system": {"torch_threads": 1}, "profile": {"load": {"cpus": 2.0, "loadavg_1m": 3.0},
                                                              "cpu_wait": {"wait_s": waited, "slices": 100_000}}}
        return [f.id for f in advise_script(record, calls, None, None, {})]

    assert advised(2 * total / 3) == ["checkpointing"]
    assert advised(0.0) == []


def test_a_workers_nested_loop_is_named_at_the_inner_loop_whose_header_takes_its_turns(tmp_path: Path) -> None:
    """A worker's CPU samples on a nested loop: most on the inner loop's header (its next item, every turn),
    the rest in its body, whose math call is a library's. The loop named is the inner one: its header's
    turns are its own work, not the outer loop's (which named the outer loop in 1 of 4 profiles)."""
    script = tmp_path / "scan.py"
    script.write_text(textwrap.dedent("""\
        import math

        def scan(points, centers):
            out = []
            for px, py in points:
                best = 5.0
                for cx, cy in centers:  # planted
                    d = math.hypot(cx - px, cy - py)
                    best = min(best, d)
                out.append(best)
            return out

        scan([(0.0, 0.0)], [(1.0, 1.0)])
        """))
    profiler = cProfile.Profile()
    profiler.enable()
    runpy.run_path(str(script))
    profiler.disable()
    p = ScriptProfile(CallStats(pstats.Stats(profiler), own=user_code([tmp_path])))
    f = str(script)
    workers = {"processes": 2, "cpu_s": 1.0, "samples": 100, "functions": [[f, 3, "scan", 1.0]],
               "lines": [[f, 3, "scan", line, s] for line, s in ((5, 0.1), (7, 0.4), (8, 0.3), (9, 0.15), (10, 0.05))],
               "edges": [[f, 8, "scan", "~", 0, "<built-in method math.hypot>", 0.25]]}
    ev = foreign.Evidence({"profile": {"load": {"cpus": 2.0}}}, p, None, None, {"workers": workers})
    spot = foreign.worker_hot_spot(ev)
    assert spot is not None and spot.where == "scan.py:7 (scan)", spot
