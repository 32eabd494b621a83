"""Running benchmarks: the runner (one cell: reference, strategies, rows), results (rows.jsonl and its
schema), sweeps (a grid of cells and the executors that run them), the packaged workloads, the engine-overhead
measurement, NVML sampling and progress output."""
