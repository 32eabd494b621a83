"""``specterbench-lm-eval``: lm-eval's own command line with the ``specterbench`` model type registered."""

from __future__ import annotations

import sys

from specterbench.bench.checks import check_device
from specterbench.errors import SpecterbenchError, UsageError
from specterbench.quality.lmeval import MODEL_TYPE


# ---- the command line ----------------------------------------------------------------------------
def _has_include_path(argv: list[str]) -> bool:
    return any(a == "--include_path" or a.startswith("--include_path=") for a in argv)


def _value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag v`` or ``--flag=v``); None when absent."""
    for i, token in enumerate(argv):
        if token == flag:
            return argv[i + 1] if i + 1 < len(argv) else ""
        if token.startswith(flag + "="):
            return token.split("=", 1)[1]
    return None


def check_wrapper_args(argv: list[str]) -> None:
    """What lm-eval would accept silently or fail on with a traceback, refused in one line first: the
    ``specterbench`` model type without ``model=`` in ``--model_args`` (it would evaluate a random seam-test
    model), and a ``--device`` this machine does not have."""
    if {"-h", "--help"} & set(argv):
        return
    if _value(argv, "--model") == MODEL_TYPE:
        model_args = _value(argv, "--model_args") or ""
        keys = {part.split("=", 1)[0].strip() for part in model_args.split(",") if "=" in part}
        if "model" not in keys:
            raise UsageError(f"--model {MODEL_TYPE} needs --model_args model=NAME (e.g. --model_args "
                             f"model=tiny-mixtral,strategy=specter,budget=50%); `specterbench list` names the models")
    device = _value(argv, "--device")
    if device:
        check_device(device)


def main(argv: list[str] | None = None) -> int:
    """``specterbench-lm-eval``: lm-eval's own command line with the ``specterbench`` model type registered."""
    from lm_eval.__main__ import cli_evaluate

    from specterbench.bench.progress import quiet_library_bars
    from specterbench.quality.tasks import SHIPPED_TASKS, SUITE, TASKS_DIR

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        check_wrapper_args(args)
    except SpecterbenchError as err:
        print(f"specterbench-lm-eval: error: {err}", file=sys.stderr)
        return 2
    quiet_library_bars()
    if args and not _has_include_path(args) and not {"-h", "--help"} & set(args):
        args += ["--include_path", str(TASKS_DIR)]
    saved = sys.argv
    sys.argv = ["lm-eval", *args]
    try:
        cli_evaluate()
    except ValueError as err:
        if "not found" not in str(err).lower():
            raise
        print(f"specterbench-lm-eval: error: {' '.join(str(err).split())} (lm-eval); shipped tasks: "
              f"{', '.join(SHIPPED_TASKS)}, group {SUITE} (in {TASKS_DIR}); standard tasks work by name when their "
              f"dataset is in the local datasets cache, see docs/eval.md", file=sys.stderr)
        return 2
    except SpecterbenchError as err:
        print(f"specterbench-lm-eval: error: {err}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0
