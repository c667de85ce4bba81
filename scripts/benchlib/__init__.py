"""Code only the benchmarks use: the load generator and the naive baseline."""
