"""Running benchmarks: the runner (one cell: reference, strategies, rows), sweeps (a grid of cells and the executors
that run them), budgets and checks of a run's inputs, the packaged workloads, calibration and validation of a
hardware profile, the published record, the engine-overhead measurement, NVML sampling and progress output."""
