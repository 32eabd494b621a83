"""Shared by the bad-input tests: what a refused command must print."""


def one_line(err: str) -> str:
    """The single stderr line of a refused command (no traceback, nothing else)."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("specterbench: error:"), err
    return lines[0]
