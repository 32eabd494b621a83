"""Prompt length and context depth as axes (``--prompt-tokens 512,2048``, ``--depth 0,4096``).

Prompts of exactly the asked length are cut from the workload's held-out text, its prompts joined into one token
stream (repeated when the asked tokens outrun it). Each request reads one window of the stream: its first
``depth`` tokens are context, prefilled before the request's timing starts (``Request.context_tokens``), the next
``length`` tokens are the timed prompt, so TTFT is the prompt's prefill at that depth and every decoded token
attends to depth + prompt + the tokens before it. Consecutive requests take consecutive windows.
"""

from __future__ import annotations

from dataclasses import dataclass

from specterbench.bench.checks import context_tokens
from specterbench.errors import UsageError


@dataclass(frozen=True, slots=True)
class Shape:
    """One point of the axes: ``length`` prompt tokens (None: the workload's prompts as they are) after ``depth``
    tokens of context."""

    length: int | None = None
    depth: int = 0

    @property
    def key(self) -> str:
        """The cell key's part (empty for the workload's own prompts at depth 0, so those keys are unchanged)."""
        parts = ([f"p{self.length}"] if self.length is not None else []) + ([f"d{self.depth}"] if self.depth else [])
        return "|".join(parts)

    @property
    def suffix(self) -> str:
        """What the workload's name gains in the reference file and progress lines (empty for the plain workload)."""
        parts = ([f"{self.length} prompt tokens"] if self.length is not None else []) + (
            [f"depth {self.depth}"] if self.depth else [])
        return f" ({', '.join(parts)})" if parts else ""

    progress = suffix


def parse_tokens(flag: str, text: str | None, *, zero: bool) -> tuple[int, ...]:
    """``"512,2048"`` → (512, 2048); one UsageError line for anything else (``zero``: 0 is allowed, as a depth)."""
    if text is None or not text.strip():
        return ()
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        value = int(part) if part.isdigit() else None
        if value is None or value < (0 if zero else 1):
            least = "0 or more" if zero else "1 or more"
            raise UsageError(f"{flag} {part!r} is not a number of tokens; give whole numbers, {least}, comma-"
                             f"separated (e.g. {flag} {'0,4096' if zero else '512,2048'})")
        if value not in out:
            out.append(value)
    return tuple(out)


def shapes(lengths: tuple[int, ...], depths: tuple[int, ...]) -> tuple[Shape, ...]:
    """Every (length, depth) of the axes, lengths outer."""
    return tuple(Shape(p, d) for p in (lengths or (None,)) for d in (depths or (0,)))


def shaped_cells(runner, model: str, cells) -> list[tuple]:
    """``cells`` (the runner's, with their batch) once per shape of the run's axes, the shape appended; a key gains
    ``p<length>`` / ``d<depth>`` only when its shape asks for them."""
    cfg, cells = runner.config, list(cells)
    out = []
    for shape in shapes(cfg.prompt_tokens, cfg.depths):
        for key, *rest in cells:
            out.append((f"{key}|{shape.key}" if shape.key else key, *rest, shape))
    return out


def prompts_for(engine, natural, texts: list[tuple[str, str]], n: int, shape: Shape,
                new_tokens: int) -> list[tuple[str, tuple[int, ...]]]:
    """The requests' prompts at ``shape`` as ``(id, ids)``, context first: the workload's own (``natural``, encoded)
    at depth 0, ``n`` cut to the asked length otherwise, with ``shape.depth`` tokens of context before each.
    Refused in one line when depth + prompt + ``new_tokens`` is beyond the model's context."""
    check_shape(engine.name, context_tokens(engine), shape, new_tokens, max(len(ids) for _, ids in natural),
                getattr(engine.model.config, "model_type", None))
    if shape.length is not None:
        return shaped_prompts(engine.tokenizer, texts, n, shape)
    if not shape.depth:
        return natural
    stream = token_stream(engine.tokenizer, [text for _, text in texts])
    long = stream * max(1, -(-(len(natural) * shape.depth) // len(stream)))
    return [(f"{pid}@d{shape.depth}", tuple(long[i * shape.depth:(i + 1) * shape.depth]) + ids)
            for i, (pid, ids) in enumerate(natural)]


def token_stream(tokenizer, texts: list[str]) -> list[int]:
    """The workload's prompts joined into one stream of token ids, each encoded on its own (a tokenizer warns of
    one text longer than the model's context), blank lines after each."""
    ids = [i for text in texts for i in tokenizer.encode(text + "\n\n")]
    if not ids:
        raise UsageError("the workload encodes to no tokens; choose another --workload")
    return ids


def shaped_prompts(tokenizer, texts: list[tuple[str, str]], n: int, shape: Shape) -> list[tuple[str, tuple[int, ...]]]:
    """``n`` prompts of ``shape.depth + shape.length`` tokens each (context first), as ``(id, ids)``; ids name the
    shape and the window (``p512-d4096-3``)."""
    stream = token_stream(tokenizer, [text for _, text in texts])
    size = shape.depth + shape.length
    reps = -(-(n * size) // len(stream))  # the stream repeated as often as the windows need
    long = stream * max(1, reps)
    return [(f"p{shape.length}-d{shape.depth}-{i}", tuple(long[i * size:(i + 1) * size])) for i in range(n)]


def check_shape(name: str, limit: int | None, shape: Shape, new_tokens: int, natural: int = 0,
                family: str | None = None) -> None:
    """Refuse a depth + prompt + new tokens beyond the model's context, naming the most that fits (``natural``:
    the longest of the workload's own prompts, when no length is asked for)."""
    if limit is None:
        return
    length = shape.length if shape.length is not None else natural
    used = shape.depth + length + new_tokens
    if used <= limit:
        return
    room = limit - new_tokens - shape.depth
    fixes = [f"--depth {max(limit - new_tokens - length, 0)} or less"] if shape.depth else []
    fixes += [f"--prompt-tokens {room} or less"] if shape.length is not None and room > 0 else []
    fix = "use " + (", or ".join(fixes) or f"--tokens {max(limit - shape.depth - length, 0)} or less")
    asked = f"--prompt-tokens {shape.length}" if shape.length is not None else f"a {natural}-token prompt"
    raise UsageError(f"--depth {shape.depth} with {asked} and --tokens {new_tokens} needs {used} positions, beyond "
                     f"{name}'s context of {limit}; {fix}, or run a checkpoint with a longer context (--model-path; "
                     f"`specterbench random-checkpoint DIR --family {family or 'mixtral'} --set "
                     f"max_position_embeddings={used}` writes a random one)")
