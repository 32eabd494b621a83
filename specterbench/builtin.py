"""The built-in plugin: hardware profiles, models and the host's environment metadata."""

from __future__ import annotations

import platform

from . import hookimpl
from .models import tiny_random_specs
from .profiles import BUILTIN_PROFILES


@hookimpl
def specterbench_register_profiles(register):
    for profile in BUILTIN_PROFILES:
        register(profile)


@hookimpl
def specterbench_register_models(register):
    for spec in tiny_random_specs():
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
