import pytest

from specterbench.analysis import plots
from specterbench.analysis.plots import write_plots
from specterbench.runfiles.results import ResultRow


def row(**kw) -> ResultRow:
    base = dict(run_id="r", cell="c", model="tiny", geometry="tiny", geometry_label="tiny",
                priced_total_expert_bytes=100, strategy="lru", strategy_version="1", strategy_plugin="baselines",
                lossless_strategy=True, budget_bytes=35, budget_fraction=0.35, total_expert_bytes=100,
                profile="a100-40g-pcie4", clock="modeled", workload="w", prompts=2, new_tokens=8, seed=0, repeat=0,
                tpot_ms=1.0, hit_rate=0.5, h2d_bytes_per_token=2e5, host_ms_per_token=3.0)
    base.update(kw)
    return ResultRow(**base)


def spec(k, budget, hist, strategy="specter"):
    return row(strategy=strategy, budget_fraction=budget, extra={"k": k, "accepted_length_hist": hist,
                                                                 "tokens_per_window": 2.0})


@pytest.fixture
def figures(monkeypatch):
    """Every figure write_plots makes, to read its labels."""
    made = []
    original = plots._figure

    def recording():
        fig, ax = original()
        made.append(ax)
        return fig, ax

    monkeypatch.setattr(plots, "_figure", recording)
    return made


def grid():
    rows = [row(strategy=s, budget_fraction=b, tpot_ms=t * b) for s, t in (("lru", 2.0), ("static", 1.5))
            for b in (0.35, 0.5)]
    rows.append(row(strategy="resident", budget_fraction=1.0, tpot_ms=0.5, hit_rate=1.0, h2d_bytes_per_token=0.0))
    rows.append(row(strategy="broken", status="error", error="boom", tpot_ms=None))
    return rows


def test_budget_plots_are_pngs_with_units_and_the_modeled_profile(tmp_path, figures):
    paths = write_plots(tmp_path, grid())
    assert [p.name.split("__")[0] for p in paths] == ["tpot_vs_budget", "hit_rate_vs_budget",
                                                      "h2d_bytes_per_token_vs_budget"]
    for p in paths:
        assert p.parent == tmp_path / "plots" and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    tpot, hit, h2d = figures
    assert tpot.get_ylabel() == "TPOT, median over decode tokens (ms/token)\nmodeled (a100-40g-pcie4)"
    assert "fraction" in hit.get_ylabel() and "modeled (a100-40g-pcie4)" in hit.get_ylabel()
    assert "KB/token" in h2d.get_ylabel()
    assert tpot.get_xlabel() == "expert budget (% of all expert bytes)"


def test_error_rows_are_left_out_and_strategies_are_lines(tmp_path, figures):
    write_plots(tmp_path, grid())
    legend = [t.get_text() for t in figures[0].get_legend().get_texts()]
    assert legend == ["lru", "resident (at 100%)", "static"]
    lru = next(line for line in figures[0].get_lines() if line.get_label() == "lru")
    assert list(lru.get_xdata()) == [35.0, 50.0] and list(lru.get_ydata()) == [0.7, 1.0]


def test_host_clock_plots_host_wall_time_never_tpot(tmp_path, figures):
    write_plots(tmp_path, [row(clock="host", profile="-", tpot_ms=None)])
    label = figures[0].get_ylabel()
    assert label.startswith("host wall time, median over decode tokens (ms/token)") and "not a GPU's TPOT" in label


def test_a_projection_says_so(tmp_path, figures):
    write_plots(tmp_path, [row(geometry="mixtral")])
    assert "priced at mixtral sizes" in figures[0].get_xlabel()
    assert "priced at mixtral geometry (projection)" in figures[0].get_title()


def test_accepted_length_vs_k_when_the_run_has_several_k(tmp_path, figures):
    rows = [spec(2, 0.5, {"0": 1, "2": 3}), spec(4, 0.7, {"1": 2, "4": 2})]
    paths = write_plots(tmp_path, rows)
    assert paths[-1].name.startswith("accepted_vs_k__")
    ax = figures[-1]
    line = next(x for x in ax.get_lines() if x.get_label() == "specter")
    assert list(line.get_xdata()) == [2, 4] and list(line.get_ydata()) == [1.5, 2.5]
    assert ax.get_xlabel().startswith("K (") and "(tokens)" in ax.get_ylabel()


def test_accepted_length_histogram_with_a_single_k(tmp_path, figures):
    rows = [spec(2, 0.5, {"0": 1, "2": 3}), spec(2, 0.7, {"1": 4}), spec(2, 0.5, {"2": 2}, strategy="spec-decode")]
    paths = write_plots(tmp_path, rows)
    assert paths[-1].name.startswith("accepted_length_hist__")
    ax = figures[-1]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["spec-decode (2 windows)",
                                                                   "specter (8 windows)"]
    assert "K = 2" in ax.get_xlabel()


def test_a_run_without_ok_rows_has_no_plots(tmp_path):
    assert write_plots(tmp_path, [row(status="error", error="x")]) == []


BUILTIN = ["activation-aware", "cpu-experts", "lfru", "lfu", "lru", "mixed-precision", "next-layer-gate",
           "on-demand", "oracle", "oracle-spec", "resident", "spec-decode", "spec-host", "specmoeoff", "specter",
           "specter-artifact", "static"]


def test_every_builtin_strategy_has_its_own_colour_and_marker_line_pair():
    styles = [plots.style(s) for s in BUILTIN]
    assert len({st.color for st in styles}) == len(BUILTIN)
    assert len({(st.marker, st.linestyle) for st in styles}) == len(BUILTIN)


def test_specter_is_the_most_visible_and_drawn_last():
    sp = plots.style("specter")
    others = [plots.style(s) for s in BUILTIN if s != "specter"]
    assert all(sp.linewidth > o.linewidth and sp.zorder > o.zorder for o in others)
    assert plots.draw_order(["specter", "lru", "zzz"])[-1] == "specter"


def test_an_unknown_strategy_gets_the_same_style_every_time():
    assert plots.style("my-plugin-strategy") == plots.style("my-plugin-strategy")


def test_strategies_keep_their_style_across_plots_and_runs(tmp_path, figures):
    write_plots(tmp_path, grid())
    lines = {line.get_label(): line.get_color() for ax in figures for line in ax.get_lines()}
    assert lines["lru"] == plots.style("lru").color and lines["static"] == plots.style("static").color


def test_budget_axis_ticks_are_the_budgets_that_ran(tmp_path, figures):
    write_plots(tmp_path, grid())
    labels = [t.get_text() for t in figures[0].get_xticklabels()]
    assert labels == ["35%", "50%", "100%"]


def test_accepted_vs_k_has_integer_k_ticks_and_no_strategy_hides_another(tmp_path, figures):
    hist = {"0": 1, "1": 2}
    rows = [spec(k, 0.5, hist, strategy=s) for s in ("specter", "spec-decode") for k in (2, 4)]
    rows.append(spec("auto", 0.5, hist))  # K chosen per window: not a point on the K axis
    write_plots(tmp_path, rows)
    ax = figures[-1]
    assert [t for t in ax.get_xticks()] == [2, 4]
    xs = {line.get_label(): tuple(line.get_xdata()) for line in ax.get_lines()}
    assert xs["specter"] != xs["spec-decode"]  # dodged sideways


def test_specter_choosing_k_per_window_is_in_the_accepted_vs_k_plot(tmp_path, figures):
    rows = [spec(k, 0.5, {"0": 1, "2": 3}, strategy="spec-decode") for k in (2, 4)]
    rows.append(row(strategy="specter", budget_fraction=0.5,
                    extra={"k": "auto", "accepted_length_hist": {"1": 2, "3": 2}, "k_hist": {"2": 2, "4": 2}}))
    write_plots(tmp_path, rows)
    ax = figures[-1]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "specter (K chosen per window, mean K 3.0)" in labels
    marker = next(x for x in ax.get_lines() if x.get_label().startswith("specter ("))
    assert list(marker.get_xdata()) == [3.0] and list(marker.get_ydata()) == [2.0]


def test_accepted_length_ticks_stay_readable_up_to_k_32(tmp_path, figures):
    hist = {str(n): 1 for n in range(33)}
    write_plots(tmp_path, [spec(32, 0.5, hist), spec(32, 0.5, hist, strategy="specter-artifact")])
    ax = figures[-1]
    ticks = [t for t in ax.get_xticks() if 0 <= t <= 32]
    assert len(ticks) <= plots.MAX_TICKS + 1 and all(float(t).is_integer() for t in ticks)


def test_a_strategy_that_dwarfs_the_rest_switches_the_budget_plot_to_a_log_scale(tmp_path, figures):
    rows = [row(strategy=s, budget_fraction=b, tpot_ms=t) for s, t in (("lru", 1.0), ("static", 1.2),
                                                                        ("on-demand", 40.0)) for b in (0.35, 0.5)]
    write_plots(tmp_path, rows)
    tpot = figures[0]
    assert tpot.get_yscale() == "log" and "log scale" in tpot.get_ylabel()
    assert figures[1].get_yscale() == "linear"  # hit rates: comparable


def test_comparable_strategies_keep_a_linear_axis(tmp_path, figures):
    write_plots(tmp_path, grid())
    assert figures[0].get_yscale() == "linear"
