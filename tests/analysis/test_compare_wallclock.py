import json

from specterbench.analysis.wallclock import compare
from specterbench.cli import main as cli_main


def save(path, mins):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"benchmarks": [
        {"fullname": f"benchmarks/b.py::{name}", "stats": {"min": m, "median": m * 1.5, "mean": m * 2}}
        for name, m in mins.items()]}))
    return path


BASE = {f"t{i}": 1.0 + i for i in range(10)}


def test_single_benchmarks_moving_2x_either_way_pass_when_the_whole_does_not(tmp_path):
    noisy = {n: m * (1.99 if i % 2 else 0.5) for i, (n, m) in enumerate(BASE.items())}
    passed, report = compare(save(tmp_path / "a.json", BASE), save(tmp_path / "b.json", noisy))
    assert passed and "1.99" in report and "geometric mean over 10 benchmarks" in report


def test_a_2x_slowdown_of_every_hot_path_fails(tmp_path):
    slow = {n: 2 * m for n, m in BASE.items()}
    passed, report = compare(save(tmp_path / "a.json", BASE), save(tmp_path / "b.json", slow))
    assert not passed and "FAIL" in report


def test_a_storage_folder_compares_the_newest_run_with_the_one_before(tmp_path, capsys):
    storage = tmp_path / "benchmarks"
    save(storage / "Linux" / "0001_aaa.json", BASE)
    assert cli_main(["wallclock-compare", str(storage)]) == 0 and "baseline" in capsys.readouterr().out
    save(storage / "Linux" / "0002_bbb.json", {n: 3 * m for n, m in BASE.items()})
    assert cli_main(["wallclock-compare", str(storage)]) == 1
    save(storage / "Linux" / "0003_ccc.json", {n: 3 * m for n, m in BASE.items()})
    assert cli_main(["wallclock-compare", str(storage)]) == 0  # 0003 vs 0002: unchanged


def test_a_file_that_is_not_a_benchmark_run_is_one_line(tmp_path, capsys):
    (tmp_path / "x.json").write_text("[1, 2]")
    assert cli_main(["wallclock-compare", str(tmp_path / "x.json"), str(tmp_path / "x.json")]) == 2
    assert capsys.readouterr().err.startswith("specterbench: error:")


def test_a_busier_machine_is_divided_out_by_the_probe(tmp_path):
    busy = {n: 1.8 * m for n, m in BASE.items()}  # unchanged code, the machine 1.8x slower
    base, new = save(tmp_path / "a.json", BASE), save(tmp_path / "b.json", busy)
    for path, probe in ((base, 1e-3), (new, 1.8e-3)):
        data = json.loads(path.read_text())
        path.write_text(json.dumps({**data, "probe_s": probe}))
    passed, report = compare(base, new)
    assert passed and "divided by the machine probe's ratio 1.800" in report


def test_the_probe_plugin_records_the_machine_speed():
    from specterbench.testing import wallclock_probe

    wallclock_probe.sample(3)
    out = {}
    wallclock_probe.pytest_benchmark_update_json(None, [], out)
    assert 0 < out["probe_s"] < 1
