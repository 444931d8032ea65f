"""The instruments around a run (cProfile, GC, torch.profiler, py-spy), the profiling library behind
``rlperf profile``, and the advisor that reads their evidence."""
