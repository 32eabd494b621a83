"""Dataset loader for the shipped tasks, referenced from their YAML as ``custom_dataset: !function loader.load``.

lm-eval hands ``dataset_kwargs`` to ``datasets.load_dataset``, which resolves a relative ``data_files``
against the current working directory. This loader resolves it against this directory instead, so the
tasks work from any working directory and from an installed package. lm-eval loads this file by path (not
as ``specterbench.quality.tasks.loader``), so it imports nothing from specterbench.
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(data_files=None, **_metadata):
    """``data_files``: ``{split: file name relative to this directory}``; other keyword arguments (lm-eval
    passes the task metadata and the model arguments) are ignored."""
    import datasets

    if not isinstance(data_files, dict) or not data_files:
        raise ValueError(f"the task's dataset_kwargs must name data_files as {{split: file}}, got {data_files!r}")
    files = {}
    for split, name in data_files.items():
        path = HERE / name
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing: reinstall specterbench or run "
                                    f"`specterbench make-tasks`")
        files[split] = str(path)
    return datasets.load_dataset("json", data_files=files)
