"""Priority storage in a flat numpy array; prefix sums are rebuilt lazily before sampling."""
import numpy as np


class FlatPriorities:
    def __init__(self, capacity):
        self.capacity = capacity
        self.prio = np.zeros(capacity, dtype=np.float64)
        self._cum = None

    @property
    def total(self):
        return float(self._prefix()[-1])

    def min_priority(self, n):
        return float(self.prio[:n].min())

    def _prefix(self):
        if self._cum is None:
            self._cum = np.cumsum(self.prio)
        return self._cum

    def set_many(self, indices, values):
        self.prio[np.asarray(indices, dtype=np.int64)] = values
        self._cum = None

    def find_many(self, masses):
        cum = self._prefix()
        return np.minimum(np.searchsorted(cum, masses, side="left"), self.capacity - 1)

    def get(self, indices):
        return self.prio[np.asarray(indices, dtype=np.int64)]
