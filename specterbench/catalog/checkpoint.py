"""Loading a local Hugging Face checkpoint of a supported MoE family with host memory ≈ its own bytes.

``transformers.from_pretrained`` peaks at about twice a Mixtral-layout checkpoint's bytes of host RAM (the
per-expert tensors it reads plus the fused copies it converts them into). :func:`load_checkpoint` builds the model
with uninitialised (so not yet resident) parameters and fills every tensor in place, one safetensors shard at a
time: the per-expert ``w1``/``w3``/``w2`` (or ``gate_proj``/``up_proj``/``down_proj``) tensors go straight
into their slice of the fused ``gate_up_proj`` [E, 2I, H] / ``down_proj`` [E, H, I] tensors. The peak is the
model's bytes: each tensor is read from the file straight into its place (a temporary only when the file's
dtype differs from the model's).

What it reads: ``config.json`` (family and geometry), ``model.safetensors`` or the shards named by
``model.safetensors.index.json``, and the tokenizer files of the same directory. Every failure is one line
(:class:`~specterbench.errors.ModelError`) naming the file and the fix.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch

from specterbench.catalog.tiny import ByteTokenizer
from specterbench.engine.seam import SUPPORTED_FAMILIES
from specterbench.errors import ModelError

# a per-expert checkpoint tensor: <prefix>.experts.<e>.<part>.weight
_EXPERT_KEY = re.compile(r"^(?P<prefix>.+)\.experts\.(?P<e>\d+)\.(?P<part>w1|w2|w3|gate_proj|up_proj|down_proj)"
                         r"\.weight$")
_PART = {"w1": "gate", "gate_proj": "gate", "w3": "up", "up_proj": "up", "w2": "down", "down_proj": "down"}


def read_config(path):
    """The checkpoint's transformers config; a missing or corrupt ``config.json`` or an unsupported family is a
    one-line :class:`ModelError`."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ModelError(f"--model-path {path}: no such directory; pass the folder that holds config.json and the "
                         f"*.safetensors weights")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelError(f"{path}: no config.json; pass the checkpoint folder itself (where config.json and the "
                         f"*.safetensors files are)")
    try:
        raw = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ModelError(f"{cfg_file}: corrupt JSON ({err}); re-download the checkpoint's config.json") from None
    if not isinstance(raw, dict) or not isinstance(raw.get("model_type"), str):
        raise ModelError(f"{cfg_file}: no 'model_type' field, so the model family is unknown; supported families: "
                         f"{', '.join(SUPPORTED_FAMILIES)}")
    family = raw["model_type"]
    if family not in SUPPORTED_FAMILIES:
        raise ModelError(f"{path}: model family {family!r} is not a supported MoE family; supported families: "
                         f"{', '.join(SUPPORTED_FAMILIES)}")
    if raw.get("quantization_config"):
        raise ModelError(f"{path}: a quantized checkpoint ({raw['quantization_config'].get('quant_method', '?')}); "
                         f"pass a 16-bit checkpoint (the harness quantizes its own drafts)")
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, TypeError, KeyError, OSError) as err:
        raise ModelError(f"{cfg_file}: transformers cannot read it ({str(err).splitlines()[0]}); re-download "
                         f"config.json") from None


def weight_files(path) -> list[Path]:
    """The safetensors shards of a checkpoint, in index order; none is a one-line :class:`ModelError`."""
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as err:
            raise ModelError(f"{index}: corrupt shard index ({err}); re-download it") from None
        files = [path / n for n in dict.fromkeys(names)]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelError(f"{path}: shard(s) {', '.join(missing[:3])} named by the index are missing; finish "
                             f"the download")
        return files
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    if any(path.glob("*.bin")):
        raise ModelError(f"{path}: only PyTorch .bin weights; convert them to safetensors (load and "
                         f"save_pretrained once) — .bin files cannot be read shard by shard")
    raise ModelError(f"{path}: no weights (*.safetensors or model.safetensors.index.json); download the "
                     f"checkpoint's weight files into this folder")


# the checkpoint-key renamings of the supported families (transformers 5.x), used where transformers' own table
# is not importable; tests check both against from_pretrained for every family
_FALLBACK_RENAMES = {
    "mixtral": ((r"\.block_sparse_moe\.", ".mlp."),),
    "phimoe": ((r"\.block_sparse_moe\.", ".mlp."), (r"\.gate\.weight$", ".router.weight")),
}


class _Rename:
    def __init__(self, pattern: str, repl: str):
        self.pattern, self.repl = re.compile(pattern), repl

    def rename_source_key(self, key: str):
        return self.pattern.sub(self.repl, key), None


def _renamings(model_type: str):
    """transformers' own checkpoint-key renamings for the family (e.g. Mixtral ``block_sparse_moe`` → ``mlp``)."""
    try:
        from transformers.conversion_mapping import get_checkpoint_conversion_mapping
        from transformers.core_model_loading import WeightRenaming
    except ImportError:  # another transformers 5.x layout: the project's table of the supported families
        return [_Rename(p, r) for p, r in _FALLBACK_RENAMES.get(model_type, ())]
    return [t for t in get_checkpoint_conversion_mapping(model_type) or [] if type(t) is WeightRenaming]


def _rename(key: str, renamings) -> str:
    for r in renamings:
        key, _ = r.rename_source_key(key)
    return key


def build_empty(config, dtype: torch.dtype):
    """The model with uninitialised parameters (pages not touched, so not resident until filled)."""
    from transformers import AutoModelForCausalLM

    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # older 5.x
        from transformers.modeling_utils import no_init_weights

    with no_init_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def read_header(file: Path) -> tuple[dict, int]:
    """A safetensors file's header (name -> dtype, shape, data_offsets) and where its data starts."""
    try:
        with open(file, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            size = os.fstat(fh.fileno()).st_size
            if not 2 <= n <= size - 8:  # random bytes or a cut file: the length itself is nonsense
                raise ValueError(f"its header length {n} does not fit the file's {size} bytes")
            header = json.loads(fh.read(n))
            if not isinstance(header, dict):
                raise ValueError("its header is not a JSON table")
    except (OSError, ValueError, UnicodeDecodeError, OverflowError, MemoryError) as err:
        raise ModelError(f"{file}: not a readable safetensors file ({err}); re-download it") from None
    header.pop("__metadata__", None)
    return header, 8 + n


def _read_into(fh, start: int, info: dict, dest: torch.Tensor, file: Path, key: str) -> None:
    """Read one tensor straight into ``dest`` (no intermediate copy when the dtypes match)."""
    dtype = _DTYPES.get(info["dtype"])
    if dtype is None:
        raise ModelError(f"{file.name}: {key!r} has dtype {info['dtype']}, which the loader does not read; pass a "
                         f"16- or 32-bit checkpoint")
    if tuple(info["shape"]) != tuple(dest.shape):
        raise ModelError(f"{file.name}: {key!r} has shape {tuple(info['shape'])}, the config wants "
                         f"{tuple(dest.shape)}; the checkpoint does not match config.json")
    lo, hi = info["data_offsets"]
    buf = dest if dtype == dest.dtype and dest.is_contiguous() else torch.empty(dest.shape, dtype=dtype)
    if hi - lo != buf.numel() * buf.element_size():
        raise ModelError(f"{file.name}: {key!r} holds {hi - lo} bytes for shape {tuple(info['shape'])}; the file "
                         f"is corrupt, re-download it")
    fh.seek(start + lo)
    if buf.numel() and fh.readinto(buf.view(-1).view(torch.uint8).numpy()) != hi - lo:
        raise ModelError(f"{file.name}: {key!r} is truncated; the download is incomplete")
    if buf is not dest:
        dest.copy_(buf)


def fill_from_safetensors(model, files, renamings=()) -> None:
    """Copy every tensor of ``files`` into ``model`` in place, read straight from the files (no memory map, no
    temporary when dtypes match); raises :class:`ModelError` on a key or shape that does not fit, and on model
    tensors the checkpoint leaves unset (tied embeddings excepted)."""
    targets = dict(model.state_dict(keep_vars=True))  # name -> parameter or persistent buffer
    loaded: set[str] = set()
    expert_parts: dict[str, int] = {}
    with torch.no_grad():
        for file in files:
            header, start = read_header(file)
            with open(file, "rb", buffering=0) as fh:
                for key, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
                    m = _EXPERT_KEY.match(key)
                    if m:
                        base, dest = _expert_dest(targets, m, renamings, file)
                        _read_into(fh, start, info, dest, file, key)
                        expert_parts[base] = expert_parts.get(base, 0) + 1
                        continue
                    name = _rename(key, renamings)
                    target = targets.get(name)
                    if target is None:
                        if name.endswith("rotary_emb.inv_freq"):
                            continue  # old checkpoints saved the rotary buffer; the model computes its own
                        raise ModelError(f"{file.name}: tensor {key!r} has no place in the {model.config.model_type} "
                                         f"model; the checkpoint does not match its config.json")
                    _read_into(fh, start, info, target.data, file, key)
                    loaded.add(name)
    for name, parts in expert_parts.items():
        experts = targets[f"{name}.gate_up_proj"].shape[0]
        if parts != 3 * experts:
            raise ModelError(f"{name}: {parts} expert tensors in the checkpoint, {3 * experts} expected "
                             f"({experts} experts x gate, up, down); the checkpoint is incomplete")
        loaded.update({f"{name}.gate_up_proj", f"{name}.down_proj"})
    loaded_ptrs = {targets[n].data_ptr() for n in loaded}
    if getattr(model.config, "tie_word_embeddings", False):
        model.tie_weights()
    missing = sorted(n for n, t in model.state_dict(keep_vars=True).items() if t.data_ptr() not in loaded_ptrs)
    if missing:
        raise ModelError(f"checkpoint leaves {len(missing)} tensor(s) unset, e.g. {missing[0]!r}; the weights are "
                         f"incomplete or belong to another model")


def _expert_dest(targets, m, renamings, file) -> tuple[str, torch.Tensor]:
    """Where a per-expert tensor goes: its rows of ``gate_up_proj[e]`` ([I, H] gate or up) or ``down_proj[e]``."""
    base = _rename(f"{m['prefix']}.experts", renamings)
    part, e = _PART[m["part"]], int(m["e"])
    gate_up, down = targets.get(f"{base}.gate_up_proj"), targets.get(f"{base}.down_proj")
    if gate_up is None or down is None or e >= gate_up.shape[0]:
        raise ModelError(f"{file.name}: expert tensor {m.group(0)!r} has no place in the model; the checkpoint "
                         f"does not match its config.json")
    inter = gate_up.shape[1] // 2
    if part == "gate":
        return base, gate_up.data[e, :inter]
    if part == "up":
        return base, gate_up.data[e, inter:]
    return base, down.data[e]


def load_tokenizer(path, vocab_size: int):
    """The directory's tokenizer; a random-init checkpoint without one gets byte tokens (ids 0-255)."""
    path = Path(path)
    has_files = any((path / n).is_file() for n in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"))
    if not has_files:

        if vocab_size < 256:
            raise ModelError(f"{path}: no tokenizer files and a vocabulary of {vocab_size} < 256 byte tokens; add "
                             f"the tokenizer files (tokenizer.json) to the folder")
        return ByteTokenizer()
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        raise ModelError(f"{path}: the tokenizer cannot be loaded ({str(err).splitlines()[0]}); re-download the "
                         f"tokenizer files") from None


def load_checkpoint(path, dtype: torch.dtype = torch.bfloat16):
    """``(model, tokenizer)`` of a local checkpoint, filled shard by shard (see the module docstring)."""
    path = Path(path).expanduser()
    config = read_config(path)
    files = weight_files(path)
    model = build_empty(config, dtype)
    fill_from_safetensors(model, files, _renamings(config.model_type))
    return model, load_tokenizer(path, config.vocab_size)


def model_bytes(model) -> int:
    """Bytes of every distinct parameter and buffer of ``model`` (tied tensors once)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


# ---- random-init checkpoints in the real layout (tests, scaling studies) ---------------------------------------
_EXPERT_NAMES = {"mixtral": ("block_sparse_moe", "w1", "w3", "w2"), "phimoe": ("block_sparse_moe", "w1", "w3", "w2")}
_QWEN_NAMES = ("mlp", "gate_proj", "up_proj", "down_proj")


def _checkpoint_key(name: str, family: str) -> str:
    """The Hub checkpoint's name of a model tensor (the inverse of transformers' renaming on load)."""
    if family in ("mixtral", "phimoe"):
        name = name.replace(".mlp.", ".block_sparse_moe.")
        if family == "phimoe":
            name = name.replace(".block_sparse_moe.router.weight", ".block_sparse_moe.gate.weight")
    return name


def write_random_checkpoint(path, config, *, seed: int = 0, std: float = 0.02, dtype=torch.bfloat16,
                            shard_bytes: int = 256 * 2**20) -> Path:
    """Write a seeded random-init checkpoint of ``config`` as the Hub lays it out: ``config.json``, per-expert
    tensors (``experts.<e>.w1/w3/w2`` or ``gate_proj/up_proj/down_proj``), ``model-XXXXX.safetensors`` shards of
    about ``shard_bytes`` and ``model.safetensors.index.json``. Weights are uniform with standard deviation ``std``;
    norm weights are ones, biases zeros. Host memory: about one shard."""
    from safetensors.torch import save_file

    family = config.model_type
    expert_block, gate, up, down = _EXPERT_NAMES.get(family, _QWEN_NAMES)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config.dtype = dtype
    config.save_pretrained(path)
    model = build_empty(config, dtype)  # shapes only: its parameters are never touched
    gen = torch.Generator().manual_seed(seed)

    def rand(shape):
        bound = std * 3**0.5  # uniform in [-b, b] has standard deviation std (and is faster to draw than normal)
        return torch.empty(shape, dtype=dtype).uniform_(-bound, bound, generator=gen)

    shard: dict[str, torch.Tensor] = {}
    weight_map: dict[str, str] = {}
    size = 0

    def flush():
        nonlocal shard, size
        if shard:
            name = f"model-{len(set(weight_map.values())) + 1:05d}.safetensors"
            save_file(shard, str(path / name), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(shard, name))
            shard, size = {}, 0

    def put(key, tensor):
        nonlocal size
        shard[key] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            flush()

    tied = getattr(config, "tie_word_embeddings", False)
    for name, t in model.state_dict().items():
        if tied and name == "lm_head.weight":
            continue
        for suffix in (".experts.gate_up_proj", ".experts.down_proj"):
            if name.endswith(suffix):
                block = name[: -len(suffix)].rsplit(".", 1)[0] + f".{expert_block}"  # ...layers.N.<block>
                for e in range(t.shape[0]):
                    if suffix.endswith("gate_up_proj"):
                        half = (t.shape[1] // 2, t.shape[2])
                        put(f"{block}.experts.{e}.{gate}.weight", rand(half))
                        put(f"{block}.experts.{e}.{up}.weight", rand(half))
                    else:
                        put(f"{block}.experts.{e}.{down}.weight", rand(tuple(t.shape[1:])))
                break
        else:
            if not t.is_floating_point() or name.endswith("bias"):
                value = torch.zeros(t.shape, dtype=t.dtype)
            elif t.dim() == 1:
                value = torch.ones(t.shape, dtype=t.dtype)  # norms
            else:
                value = rand(t.shape).to(t.dtype)
            put(_checkpoint_key(name, family), value)
    flush()
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path
