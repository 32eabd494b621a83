"""Testing aids shipped with the package: the pytest plugin (fixtures for strategy authors), the strategy
conformance battery (``pytest --specterbench-strategy=NAME``) and the watched runs it reads (lab.py), and the
machine-speed probe of the wall-clock benchmarks."""
