"""The workload: Snake, batched (:class:`~rlperf.env.vector.VectorSnake`) and single-board
(:class:`~rlperf.env.single.SnakeEnv`), the flood fill, Gymnasium's vector wrappers as a backend,
the Gymnasium registration and the greedy heuristic the trained agent must beat."""
