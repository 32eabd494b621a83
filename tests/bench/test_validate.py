"""``specterbench validate``: the same cells measured and modeled, and the modeled-vs-measured TPOT error."""

from types import SimpleNamespace

import pytest

from specterbench.bench import calibrate as cal
from specterbench.bench.validate import compare, render, validate


def fake_row(strategy, clock, samples, status="ok", hit_rate=0.5):
    return SimpleNamespace(strategy=strategy, budget_fraction=0.5, clock=clock, status=status, error=None,
                           samples=samples, hit_rate=hit_rate)


def test_the_error_is_modeled_over_measured_minus_one_with_means():
    measured = [fake_row("lru", "host", {"host_ms": [10.0, 30.0], "tpot_ms": []})]
    modeled = [fake_row("lru", "modeled", {"tpot_ms": [15.0, 15.0]})]
    (c,) = compare(measured, modeled)
    assert (c.measured_tpot_ms, c.modeled_tpot_ms) == (20.0, 15.0)
    assert c.error == pytest.approx(-0.25)
    assert c.measured_clock == "host" and c.status == "ok"
    text = render([c], "p", "m")
    assert "| lru | 50% | 20.000 | 15.000 | -25.0% | host |" in text
    assert "not a GPU's TPOT" in text


def test_a_cuda_run_compares_its_own_tpot_samples():
    measured = [fake_row("lru", "measured", {"host_ms": [99.0], "tpot_ms": [4.0]})]
    modeled = [fake_row("lru", "modeled", {"tpot_ms": [5.0]})]
    (c,) = compare(measured, modeled)
    assert c.error == pytest.approx(0.25)
    assert "not a GPU's TPOT" not in render([c], "p", "m")


def test_a_failed_cell_has_no_error_figure_and_says_why():
    measured = [fake_row("specter", "host", {"host_ms": [1.0]}, status="diverged")]
    (c,) = compare(measured, [])
    assert c.error is None and c.status.startswith("modeled: no row")


def test_validate_runs_measured_and_modeled_on_the_host(tmp_path, small_prompts):
    from specterbench.plugins.host import get_host, reset_host

    profile = cal.calibrate("cpu", quick=True, threads=1, hidden=256, inter=512).write(tmp_path / "host.toml")
    from specterbench.bench.budget import parse_budget

    reset_host()
    try:
        comparisons, text = validate(get_host(), profile_path=profile, model="tiny-random-mixtral",
                                     strategies=("lru", "cpu-experts"), budgets=(parse_budget("50%"),), prompts=1,
                                     tokens=3, device="cpu", out=tmp_path / "v")
    finally:
        reset_host()
    assert [c.strategy for c in comparisons] == ["lru", "cpu-experts"]
    for c in comparisons:
        assert c.status == "ok"
        assert c.measured_tpot_ms > 0 and c.modeled_tpot_ms > 0 and c.error is not None
        assert c.measured_clock == "host"
    assert (tmp_path / "v" / "validate.md").read_text() == text
    assert (tmp_path / "v" / "validate.json").exists()
    assert (tmp_path / "v" / "measured" / "rows.jsonl").exists()
    assert (tmp_path / "v" / "modeled" / "rows.jsonl").exists()


def test_a_folder_that_holds_a_validation_is_refused(tmp_path):
    from specterbench.errors import UsageError
    from specterbench.plugins.host import get_host

    (tmp_path / "v" / "measured").mkdir(parents=True)
    (tmp_path / "v" / "measured" / "rows.jsonl").write_text("")
    with pytest.raises(UsageError, match="already holds a validation"):
        validate(get_host(), profile_path=tmp_path / "p.toml", model="tiny-random-mixtral", strategies=("lru",),
                 budgets=(), prompts=1, tokens=3, device="cpu", out=tmp_path / "v")
