"""Callback hooks for the PPO trainer."""
import json
import os
import time


class Callback:
    def on_train_start(self, trainer):
        pass

    def on_step(self, trainer, info):
        pass

    def on_update(self, trainer, stats):
        pass

    def on_train_end(self, trainer):
        pass


class ProgressCallback(Callback):
    def __init__(self, every=10):
        self.every = every
        self.t0 = None

    def on_train_start(self, trainer):
        self.t0 = time.perf_counter()

    def on_update(self, trainer, stats):
        if stats["update"] % self.every == 0:
            el = time.perf_counter() - self.t0
            print(f"[upd {stats['update']:4d}] ret={stats['mean_return']:.2f} "
                  f"loss={stats['loss']:.3f} t={el:.1f}s")


class StepRecorder(Callback):
    """Writes one JSON record per environment step for later inspection."""

    def __init__(self, path, buffered=False):
        self.path = path
        self.buffered = buffered
        self.pending = []
        self.fh = None

    def on_train_start(self, trainer):
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        open(self.path, "w").close()
        if self.buffered:
            self.fh = open(self.path, "a", buffering=1 << 20)

    def on_step(self, trainer, info):
        record = {
            "step": info["global_step"],
            "reward": info["reward"].tolist(),
            "done": info["done"].tolist(),
            "action": info["action"].tolist(),
            "value": info["value"].tolist(),
        }
        line = json.dumps(record) + "\n"
        if self.buffered:
            self.pending.append(line)
            if len(self.pending) >= 512:
                self.fh.writelines(self.pending)
                self.pending.clear()
            return
        with open(self.path, "a") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())

    def on_train_end(self, trainer):
        if self.buffered:
            self.fh.writelines(self.pending)
            self.fh.close()
