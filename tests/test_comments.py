"""Comments and docstrings say why, not when: no dates, issue numbers, work sessions or README sections in code.

Every module of the package, the built-in strategies and the plugin packages is read: its comments (tokenize's
COMMENT tokens) and its docstrings (module, class and function, through ast). A measurement's date and figures belong
in docs/measurements/, a strategy's provenance in docs/strategies.md, and the README is short: a reference to one of
its sections goes stale, so a comment points to a docs/ page instead (a path such as ``workloads/README.md`` is a
file, not a section, and passes).
"""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


#: (what is wrong, pattern) — each a sign of a history or a pointer that goes stale
RULES = (
    ("a date", re.compile(r"(?<!/)\b20\d\d-\d\d-\d\d\b")),  # a docs/measurements/ file's name passes
    ("an issue number", re.compile(r"\bissues?\s*#?\d+", re.IGNORECASE)),
    ("a work session", re.compile(r"(?<!pytest )\bsessions?\b", re.IGNORECASE)),
    ("a work round", re.compile(r"\bthis round\b", re.IGNORECASE)),
    ("a README section (point to a docs/ page)", re.compile(r"(?<!/)(?<!make )\bREADME\b", re.IGNORECASE)),
)


def modules() -> list[Path]:
    found = [*(ROOT / "specterbench").rglob("*.py"), *(ROOT / "baselines").rglob("*.py")]
    for package in (ROOT / "plugins").glob("*/specterbench_*"):
        found += package.rglob("*.py")
    return sorted(p for p in found if "egg-info" not in str(p))


def texts(source: str):
    """``(line, text)`` of every comment and every docstring line of ``source``."""
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                for i, line in enumerate(first.value.value.splitlines()):
                    yield first.value.lineno + i, line


def findings(source: str) -> list[tuple[int, str, str]]:
    """``(line, what is wrong, the text)`` of every comment or docstring line that breaks a rule."""
    out = []
    for line, text in texts(source):
        for what, pattern in RULES:
            if pattern.search(text):
                out.append((line, what, text.strip()))
    return sorted(out)


@pytest.mark.parametrize("text", [
    "# measured on 2026-12-03 beside the gate",
    "# the floor (issue 27 item 5)",
    "# see Issue #24",
    "# earlier sessions pinned the int3 draft",
    "# this round moved the reference",
    '# README "Decode modes"',
    "# see the README's section Measured",
])
def test_a_history_or_a_readme_section_is_found(text):
    assert findings(text + "\n")


@pytest.mark.parametrize("text", [
    "# a new version suffix (see workloads/README.md)",
    "# round(ρ·L·k) entries; rounds differently in bf16",
    "# the issue time of a copy",
    "# see docs/clock.md (Decode modes)",
])
def test_a_why_passes(text):
    assert not findings(text + "\n")


def test_a_docstring_line_is_named_by_its_line():
    source = 'def f():\n    """First line.\n\n    As of 2026-12-03."""\n'
    assert [line for line, _, _ in findings(source)] == [4]


def test_comments_and_docstrings_say_why_not_when():
    problems = []
    for path in modules():
        name = path.relative_to(ROOT).as_posix()
        for line, what, text in findings(path.read_text(encoding="utf-8")):
            problems.append(f"{name}:{line}: {what}: {text[:100]}")
    assert not problems, "\n".join(problems)
