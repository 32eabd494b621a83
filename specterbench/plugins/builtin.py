"""The built-in plugin: hardware profiles, models and the host's environment metadata."""

from __future__ import annotations

import platform

from specterbench.catalog.models import embedded_specs, preset_specs, tiny_random_specs
from specterbench.engine.profiles import packaged_profiles
from specterbench.plugins import hookimpl


def _git_sha() -> str | None:
    """The commit of the specterbench checkout (with ``-dirty`` when it has changes), None when not a checkout."""
    import subprocess
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (sha + ("-dirty" if dirty else "")) or None


@hookimpl
def specterbench_register_profiles(register):
    for profile in packaged_profiles()[0]:
        register(profile)


@hookimpl
def specterbench_register_host_profiles(register):
    for profile in packaged_profiles()[1]:
        register(profile)


@hookimpl
def specterbench_register_models(register):
    for spec in [*embedded_specs(), *tiny_random_specs(), *preset_specs()]:
        register(spec)


@hookimpl
def specterbench_environment():
    import importlib.metadata as md

    import torch

    versions = {}
    for pkg in ("specterbench", "torch", "transformers", "pluggy", "bitsandbytes", "lm_eval", "pandas",
                "nvidia-ml-py"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            versions[pkg] = None
    env = {
        "git_sha": _git_sha(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": __import__("os").cpu_count(),
        "packages": versions,
        "cuda_available": torch.cuda.is_available(),
        "torch_threads": torch.get_num_threads(),
    }
    if torch.cuda.is_available():  # pragma: no cover - needs CUDA
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env
