"""Shared Gaussian noise table used by OpenAI-style evolution strategies."""
import numpy as np

TABLE_SIZE = 2_000_000
TABLE_SEED = 12345


class NoiseTable:
    def __init__(self, size=TABLE_SIZE, seed=TABLE_SEED):
        self.noise = np.random.default_rng(seed).standard_normal(size, dtype=np.float32)

    def get(self, offset, dim):
        return self.noise[offset:offset + dim]

    def sample_offset(self, rng, dim):
        return int(rng.integers(0, len(self.noise) - dim + 1))
