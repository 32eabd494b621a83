"""Hardware profiles for the modeled clock: data with cited sources, never code paths.

A profile prices an accelerator (compute stream) and its host link (copy stream). The modeled clock charges
each operation ``launch_us + max(flops / flops_per_s, bytes / mem_bytes_per_s)`` on the compute stream and
each expert copy ``link_latency_us + bytes / link_bytes_per_s`` on the copy stream. Kernels the engine replays from a
captured CUDA graph (``--cuda-graphs``, :mod:`specterbench.engine.graphs`) cost ``graph_node_us`` each instead. A
synchronous copy from pageable (unpinned) host memory — what ``tensor.to(device)`` does, and so accelerate's offload
hooks; ``--set on-demand.pageable=true`` — costs ``link_latency_us + bytes / pageable_link_bytes_per_s`` and holds
the compute stream for its whole length; a profile without that field refuses the option (nothing is derived).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from specterbench.engine.host_kernels import KernelRate, check_expert_kernels, kernel_rate
from specterbench.errors import UsageError

#: where the default ``graph_node_us`` comes from
GRAPH_NODE_SOURCE = ("CUDA graphs: NVIDIA Developer Blog, A. Gray, 'Getting Started with CUDA Graphs' (2019): 20 "
                     "short kernels per step take 3.8 us each launched back to back on a stream and 3.4 us each "
                     "replayed as one graph, of which ~2.9 us is the kernel: ~0.5 us per graph node; priced at "
                     "1.0 us per node plus one launch_us per replay")


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    accelerator: str
    flops_per_s: float  # dense bf16 tensor throughput actually reachable at decode shapes
    mem_bytes_per_s: float  # device memory bandwidth (HBM/GDDR)
    link_bytes_per_s: float  # measured host->device copy bandwidth from pinned memory
    link_latency_us: float  # per-copy fixed cost (DMA setup + driver)
    launch_us: float  # per-kernel launch/dispatch overhead on the compute stream
    device_memory_bytes: int
    sources: tuple[str, ...]
    # CUDA-core 32-bit instruction throughput actually reachable, for low-bit kernels' dequantization
    # (:mod:`specterbench.engine.lowbit`); 0: not stated, priced at flops_per_s / 16 (the A100's CUDA-core to
    # tensor-core ratio, 19.5 vs 312 TFLOP/s)
    alu_ops_per_s: float = 0.0
    # one kernel replayed from a captured CUDA graph (the replay itself costs one launch_us); the default is
    # :data:`GRAPH_NODE_SOURCE`'s figure, rounded up
    graph_node_us: float = 1.0
    # measured host->device bandwidth of a copy from pageable (unpinned) host memory (CUDA samples bandwidthTest
    # --memory=pageable): the driver stages it through a pinned bounce buffer, synchronously. None: not stated (a
    # pageable copy path is then refused with one line; nothing is derived from the pinned figure)
    pageable_link_bytes_per_s: float | None = None

    def __post_init__(self) -> None:
        # alu_ops_per_s may be 0 (not stated: priced at flops_per_s / 16)
        _check_fields(self, "profile", may_be_zero=("link_latency_us", "launch_us", "alu_ops_per_s",
                                                    "graph_node_us"))
        _check_optional_rate(self, "profile", "pageable_link_bytes_per_s", "bytes/s, bandwidthTest --memory=pageable")

    def pageable_bytes_per_s(self) -> float:
        """The pageable copy bandwidth, or a one-line UsageError when this profile does not state it."""
        return _stated_rate(self, "profile", "pageable_link_bytes_per_s",
                            "a pageable copy path (on-demand.pageable=true)",
                            "measure it with CUDA samples bandwidthTest --memory=pageable")

    @classmethod
    def from_dict(cls, data: dict) -> "HardwareProfile":
        return _from_dict(cls, data, "profile")

    def label(self) -> str:
        return f"modeled:{self.name}"


def _check_optional_rate(profile, kind: str, field: str, unit: str) -> None:
    """An optional field that, when stated, must be a finite number > 0 (one line naming it otherwise)."""
    v = getattr(profile, field)
    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
        raise UsageError(f"{kind} {profile.name!r}: field {field} must be a finite number > 0 ({unit}), got {v!r}; "
                         f"or leave it out")


def _stated_rate(profile, kind: str, field: str, used_by: str, how: str) -> float:
    """An optional rate an option is priced with: its value, or a one-line UsageError naming the field, what needs
    it and how to state it."""
    value = getattr(profile, field)
    if value is None:
        raise UsageError(f"{kind} {profile.name!r} has no {field}, which {used_by} is priced with; add it to the "
                         f"{kind} file ({how}) or drop the option")
    return value


def _check_fields(profile, kind: str, may_be_zero: tuple[str, ...] = ()) -> None:
    """Every number of a profile finite and positive (``may_be_zero``: at least 0), every text non-empty, at least
    one source: a one-line UsageError naming the field otherwise (inf, nan, a string, a bool included)."""
    for f in dataclasses.fields(profile):
        value = getattr(profile, f.name)
        if f.type in ("float", "int"):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise UsageError(f"{kind} {profile.name!r}: field {f.name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise UsageError(f"{kind} {profile.name!r}: field {f.name} must be finite, got {value!r}")
            if value < 0 or (value == 0 and f.name not in may_be_zero):
                raise UsageError(f"{kind} {profile.name!r}: field {f.name} must be > 0, got {value!r}")
            if f.type == "int" and value != int(value):
                raise UsageError(f"{kind} {profile.name!r}: field {f.name} must be a whole number, got {value!r}")
        elif f.type == "str" and not (isinstance(value, str) and value.strip()):
            raise UsageError(f"{kind} {getattr(profile, 'name', '?')!r}: field {f.name} must be a non-empty text, "
                             f"got {value!r}")
    sources = profile.sources
    if not sources or not all(isinstance(s, str) and s.strip() for s in sources):
        raise UsageError(f"{kind} {profile.name!r}: sources must list at least one non-empty text (where each "
                         f"figure comes from)")


def _from_dict(cls, data: dict, kind: str):
    """A profile from plain data (a TOML table); a missing or unknown field is named in one line."""
    names = [f.name for f in dataclasses.fields(cls)]
    missing = [f.name for f in dataclasses.fields(cls) if f.name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise UsageError(f"{kind} {data.get('name', '?')!r} is missing field(s) {', '.join(missing)}; "
                         f"a {kind} needs: {', '.join(names)}")
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise UsageError(f"{kind} {data.get('name', '?')!r} has unknown field(s) {', '.join(unknown)}")
    sources = data["sources"]
    if isinstance(sources, str) or not isinstance(sources, (list, tuple)):
        raise UsageError(f"{kind} {data.get('name', '?')!r}: sources must be a list of texts, got {sources!r}")
    return cls(**{**data, "sources": tuple(sources)})


DEFAULT_PROFILE = "a100-40g-pcie4"


@dataclass(frozen=True, slots=True)
class HostProfile:
    """The host CPU that computes experts in place of the accelerator (Fiddler, llama.cpp ``--n-cpu-moe``).

    An expert on the host costs ``max(flops / (kernel FLOP/s * used/threads), weight bytes / min(DRAM share, kernel
    bytes/s))``, the kernel being the host's ``expert_kernels`` entry for the experts' stored precision (shipped
    profiles state bf16 at ``flops_per_s`` and ``mem_bytes_per_s``): at decode sizes it streams its weights from
    DRAM, so memory bandwidth decides — and that DRAM also serves the link's DMA
    reads, so while a copy runs the host gets ``mem_bytes_per_s - link_bytes_per_s`` (see
    :meth:`specterbench.engine.costs.CostModel.host_dram_share`).
    """

    name: str
    cpu: str
    # sustained DRAM read bandwidth (STREAM-like), all threads: the one host memory that host experts and the link's
    # DMA reads share (CostModel.host_dram_share: the host gets this minus the link's rate while a copy runs)
    mem_bytes_per_s: float
    flops_per_s: float  # sustained bf16/fp32 GEMM throughput, all threads
    threads: int
    launch_us: float  # per-expert dispatch cost on the host (thread-pool wake-up, small-GEMM setup)
    sources: tuple[str, ...]
    # weight bytes per second one bf16 expert streams when PyTorch's eager CPU ops run it (three GEMVs, all threads)
    # on this host: below DRAM's rate where the CPU has no native bf16 dot product (AVX512_BF16). Priced only for
    # cpu-experts.torch_bf16 (Fiddler's CPU path); None: not stated (that option is then refused in one line)
    torch_bf16_bytes_per_s: float | None = None
    # the host's routed-expert kernels (KTransformers' kt-kernel, llama.cpp's ggml CPU kernels), keyed by instruction
    # set and precision: ``expert_kernels[isa][precision] = {flops_per_s, bytes_per_s, source}``; ``isa`` the one
    # whose kernels run (None: the widest stated). A host expert is priced at its precision's rate; a host profile
    # without it is refused in one line (:mod:`specterbench.engine.host_kernels`)
    isa: str | None = None
    expert_kernels: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_fields(self, "host profile", may_be_zero=("launch_us",))
        _check_optional_rate(self, "host profile", "torch_bf16_bytes_per_s", "bytes/s")
        check_expert_kernels(self.name, self.isa, self.expert_kernels)

    def kernel_rate(self, precision: str) -> KernelRate:
        """The expert kernel's rates at ``precision`` (bf16 | int8 | int4); a one-line UsageError naming the
        missing key when this host profile does not state them."""
        return kernel_rate(self, precision)

    def torch_bf16_rate(self) -> float:
        """The PyTorch bf16 expert rate, or a one-line UsageError when this host profile does not state it."""
        return _stated_rate(self, "host profile", "torch_bf16_bytes_per_s", "cpu-experts.torch_bf16=true",
                            "the weight bytes per second of one bf16 expert run by PyTorch on that host")

    @classmethod
    def from_dict(cls, data: dict) -> "HostProfile":
        return _from_dict(cls, data, "host profile")


DEFAULT_HOST_PROFILE = "desktop-ddr5"


# ---- profile files -----------------------------------------------------------------------------------------------
#: Every built-in profile, as a TOML file in the format ``specterbench calibrate`` writes: ``[profile]`` (a
#: :class:`HardwareProfile`) and/or ``[host_profile]`` (a :class:`HostProfile`), and ``[measured]`` (raw figures of a
#: calibration, not read back). Copy one, edit it, and pass it as ``--profile PATH``.
PROFILE_FILES_DIR = Path(__file__).resolve().parent / "profile_files"
_POSITIVE = {"profile": ("flops_per_s", "mem_bytes_per_s", "link_bytes_per_s", "link_latency_us", "launch_us",
                         "device_memory_bytes"),
             "host_profile": ("mem_bytes_per_s", "flops_per_s", "threads", "launch_us")}


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v) if math.isfinite(v) else "nan"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def write_profile_file(path, profile: HardwareProfile, host: HostProfile | None = None,
                       measured: dict | None = None) -> Path:
    """Write ``profile`` (and the host's profile and the raw measurements) as a profile file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"# hardware profile written by `specterbench calibrate`; use it with --profile {path}", ""]
    tables = [("profile", dataclasses.asdict(profile))]
    if host is not None:
        tables.append(("host_profile", dataclasses.asdict(host)))
    if measured:
        tables.append(("measured", measured))
    for table, data in tables:
        lines.append(f"[{table}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in data.items() if v is not None]  # None: not stated
        lines.append("")
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def _check_positive(kind: str, data: dict) -> None:
    for f in _POSITIVE[kind]:
        if f not in data:
            continue  # from_dict names missing fields
        v = data[f]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UsageError(f"profile file: [{kind}] {f} must be a number, got {v!r}; re-run specterbench calibrate")
        if not math.isfinite(v):
            raise UsageError(f"profile file: [{kind}] {f} must be finite, got {v!r}; re-run specterbench calibrate")
        if not v > 0:
            raise UsageError(f"profile file: [{kind}] {f} must be > 0, got {v!r}; re-run specterbench calibrate")


def load_profile_file(path, *, require_profile: bool = True) -> tuple[HardwareProfile | None, HostProfile | None]:
    """The profiles of a profile file (TOML, or JSON with the same tables). ``require_profile=False``: a file may
    hold only a ``[host_profile]``. Every problem is one :class:`UsageError` line naming the file."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--profile {path}: no such file; write one with `specterbench calibrate --out {path}` "
                         f"or name a built-in profile (specterbench list)")
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise UsageError(f"--profile {path}: malformed ({str(err).splitlines()[0]}); re-run specterbench "
                         f"calibrate") from None
    table = data.get("profile")
    if not isinstance(table, dict) and (require_profile or not isinstance(data.get("host_profile"), dict)):
        raise UsageError(f"--profile {path}: no [profile] table; re-run specterbench calibrate")
    if table is not None:
        _check_positive("profile", table)
    try:
        profile = HardwareProfile.from_dict(table) if table is not None else None
        host = data.get("host_profile")
        if host is not None:
            if not isinstance(host, dict):
                raise UsageError("[host_profile] must be a table")
            _check_positive("host_profile", host)
            host = HostProfile.from_dict(host)
    except UsageError as err:
        raise UsageError(f"--profile {path}: {err}") from None
    except TypeError as err:
        raise UsageError(f"--profile {path}: {err}; re-run specterbench calibrate") from None
    return profile, host


def is_profile_path(text: str) -> bool:
    """Whether ``--profile`` names a file rather than a registered profile."""
    return text.endswith((".toml", ".json")) or os.sep in text or Path(text).is_file()


@functools.lru_cache(maxsize=1)
def packaged_profiles() -> tuple[tuple[HardwareProfile, ...], tuple[HostProfile, ...]]:
    """The hardware and host profiles of every file in :data:`PROFILE_FILES_DIR` (validated like any profile file:
    a missing, non-finite or non-positive field is a one-line error naming the file)."""
    hardware, hosts = [], []
    for path in sorted(PROFILE_FILES_DIR.glob("*.toml")):
        profile, host = load_profile_file(path, require_profile=False)
        if profile is not None:
            hardware.append(profile)
        if host is not None:
            hosts.append(host)
    return tuple(hardware), tuple(hosts)


def packaged_profile(name: str) -> HardwareProfile:
    """The packaged hardware profile ``name`` (``KeyError`` when there is none)."""
    return {p.name: p for p in packaged_profiles()[0]}[name]


def packaged_host_profile(name: str) -> HostProfile:
    """The packaged host profile ``name`` (``KeyError`` when there is none)."""
    return {p.name: p for p in packaged_profiles()[1]}[name]


def default_profile() -> HardwareProfile:
    return packaged_profile(DEFAULT_PROFILE)


def default_host_profile() -> HostProfile:
    return packaged_host_profile(DEFAULT_HOST_PROFILE)


def profile_file_of(name: str) -> Path | None:
    """The packaged file that defines the (hardware or host) profile ``name``, for a user to copy; None if none."""
    for path in sorted(PROFILE_FILES_DIR.glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        if name in (data.get("profile", {}).get("name"), data.get("host_profile", {}).get("name")):
            return path
    return None
