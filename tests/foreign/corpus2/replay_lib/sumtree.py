"""Binary segment trees (sum and min) over priorities, node-by-node implementation."""
import math


class SumTree:
    def __init__(self, capacity):
        self.capacity = capacity
        self.nodes = [0.0] * (2 * capacity)
        self.mins = [math.inf] * (2 * capacity)

    @property
    def total(self):
        return self.nodes[1]

    def min_priority(self, n):
        return self.mins[1]

    def set(self, idx, value):
        pos = idx + self.capacity
        self.nodes[pos] = value
        self.mins[pos] = value
        pos //= 2
        while pos >= 1:
            left, right = 2 * pos, 2 * pos + 1
            self.nodes[pos] = self.nodes[left] + self.nodes[right]
            self.mins[pos] = min(self.mins[left], self.mins[right])
            pos //= 2

    def set_many(self, indices, values):
        for i, v in zip(indices, values):
            self.set(int(i), float(v))

    def find(self, mass):
        pos = 1
        while pos < self.capacity:
            left = 2 * pos
            if mass <= self.nodes[left]:
                pos = left
            else:
                mass -= self.nodes[left]
                pos = left + 1
        return pos - self.capacity

    def find_many(self, masses):
        return [self.find(float(m)) for m in masses]

    def get(self, indices):
        return [self.nodes[int(i) + self.capacity] for i in indices]
