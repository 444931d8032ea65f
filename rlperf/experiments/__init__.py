"""Experiments over many runs: ``compare`` (runs side by side) and ``sweep`` (a grid over config keys)."""
