"""A run from a validated config to a run directory: the lifecycle (signals, checkpoints, resume),
the record and the files, memory checks, and the async actor/learner mode with its shared memory."""
