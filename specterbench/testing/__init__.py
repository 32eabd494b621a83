"""Testing aids shipped with the package: the pytest plugin (fixtures for strategy authors), the strategy
conformance battery (``pytest --specterbench-strategy=NAME``) and the machine-speed probe of the wall-clock
benchmarks."""
