import pytest

from specterbench import Strategy, hookimpl
from specterbench.cli import main


def run(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("specterbench: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize("args, message", [
    (["--strategies", "lur"], "unknown strategy 'lur'; did you mean 'lru'"),
    (["--model", "tiny-random-mixtrl"], "did you mean 'tiny-random-mixtral'"),
    (["--profile", "h100"], "unknown profile 'h100'"),
    (["--budgets", "lots"], "malformed budget 'lots'"),
    (["--budgets", "1%"], "experts of a layer); raise it, or drop"),
    (["--budgets", "120%"], "above all expert bytes"),
    (["--tokens", "0"], "--tokens must be a positive"),
    (["--set", "lru"], "malformed --set"),
])
def test_bad_input_is_one_line_and_a_nonzero_exit(host, small_prompts, capsys, tmp_path, args, message):
    code, _, err = run(capsys, "run", "--out", str(tmp_path), "--quiet", "--prompts", "2", *args)
    assert code == 2
    assert message in one_error_line(err)


def test_debug_shows_the_traceback(host, small_prompts, tmp_path):
    with pytest.raises(Exception, match="unknown strategy"):
        main(["--debug", "run", "--strategies", "lur", "--out", str(tmp_path)])


def test_run_prints_the_table_and_writes_rows_and_summary(host, small_prompts, capsys, tmp_path):
    code, out, _ = run(capsys, "run", "--strategies", "lru,resident", "--prompts", "2", "--tokens", "4",
                       "--out", str(tmp_path), "--run-id", "r1", "--quiet")
    assert code == 0
    assert "modeled · a100-40g-pcie4" in out and "✓" in out
    assert (tmp_path / "r1" / "rows.jsonl").exists()
    summary = (tmp_path / "r1" / "summary.md").read_text()
    assert "TPOT is **modeled**" in summary and "| lru" in summary


def test_failed_row_gives_exit_1_and_keeps_the_other_rows(host, small_prompts, capsys, tmp_path):
    class Boom(Strategy):
        name = "boom"
        version = "1"

        def before_layer(self, layer, experts, n):
            raise ValueError("bad strategy")

    class P:
        @hookimpl
        def specterbench_register_strategies(self, register):
            register(Boom)

    host.register(P(), "boom-plugin")
    code, out, err = run(capsys, "run", "--strategies", "boom,lru", "--prompts", "1", "--tokens", "3",
                         "--out", str(tmp_path), "--run-id", "r", "--quiet")
    assert code == 1
    assert "boom@35%: ValueError: bad strategy" in err
    assert "| lru" in out


def test_report_stops_at_a_corrupt_line_or_skips_it(host, small_prompts, capsys, tmp_path):
    run(capsys, "run", "--strategies", "lru", "--budgets", "35%", "--prompts", "1", "--tokens", "3",
        "--out", str(tmp_path), "--run-id", "r", "--quiet")
    rows = tmp_path / "r" / "rows.jsonl"
    rows.write_text(rows.read_text() + '{"truncated": \n')
    code, _, err = run(capsys, "report", str(tmp_path / "r"))
    assert code == 2 and "rows.jsonl:2: corrupt or partial row" in one_error_line(err)
    code, out, _ = run(capsys, "report", str(tmp_path / "r"), "--on-error", "skip")
    assert code == 0 and "| lru" in out


def test_list_names_the_plugin_and_distribution(host, capsys):
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert "lru" in out and "[baselines · specterbench" in out and "a100-40g-pcie4" in out
