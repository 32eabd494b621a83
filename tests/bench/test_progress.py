import io
import sys

import pytest

from specterbench.bench.progress import is_quiet, progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def use(monkeypatch, stream):
    """Make ``stream`` stderr (inside the test: pytest re-installs its capture after fixtures run)."""
    monkeypatch.setattr(sys, "stderr", stream)
    return stream


@pytest.fixture
def terminal(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    return lambda: use(monkeypatch, Terminal())


def test_a_terminal_without_ci_shows_the_bar(terminal):
    terminal = terminal()
    assert list(progress(range(3), "cells")) == [0, 1, 2]
    assert not is_quiet() and "cells" in terminal.getvalue()


@pytest.mark.parametrize("value", ["true", "1", "yes"])
def test_ci_set_is_quiet_even_on_a_terminal(terminal, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    terminal = terminal()
    bar = progress(range(3), "cells")
    assert bar.disable and list(bar) == [0, 1, 2]
    assert terminal.getvalue() == ""


@pytest.mark.parametrize("value", ["", "0", "false"])
def test_ci_set_to_false_does_not_silence_a_terminal(terminal, monkeypatch, value):
    monkeypatch.setenv("CI", value)
    terminal()
    assert not is_quiet()


def test_output_that_is_not_a_terminal_is_quiet(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    log = use(monkeypatch, io.StringIO())
    assert is_quiet() and progress([1, 2], "prompts").disable
    assert log.getvalue() == ""


def test_quiet_flag_wins(terminal):
    terminal()
    assert progress(range(2), "cells", quiet=True).disable


def test_a_total_gives_a_manual_bar(terminal):
    terminal = terminal()
    bar = progress(4, "tokens")
    bar.update(4)
    bar.close()
    assert bar.n == 4 and "4/4" in terminal.getvalue()
