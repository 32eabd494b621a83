"""Checks of a run's inputs that need no model: each failure is one :class:`UsageError` line naming the problem and
the fix, raised before any model loads (device, workload size, strategy options), plus the context check that
needs the tokenizer (prompt + new tokens within the model's context), made before the reference pass."""

from __future__ import annotations

import torch

from specterbench.bench.calibrate import check_device as device_here
from specterbench.errors import BudgetError, UsageError
from specterbench.plugins.registry import closest


def check_device(text: str) -> None:
    """A device this machine has (``cpu``; ``cuda``/``cuda:N`` only with such a device): one line otherwise."""

    device_here(text)


def check_workload_size(workload: str, wanted: int, texts) -> None:
    """``wanted`` prompts no more than the workload holds (``texts``: what it gave): never silently clipped,
    since the cell key says how many ran."""
    if len(texts) < wanted:
        raise UsageError(f"--prompts {wanted} is more than workload {workload!r} holds ({len(texts)} prompts); "
                         f"use --prompts {len(texts)} or less")


def check_strategy_options(host, options: dict, strategies) -> None:
    """Every ``--set NAME.OPTION=VALUE`` names a strategy of this run and one of its options, and the strategy
    accepts the value: the class's ``option_names()`` list the options, its ``validate_options`` checks their
    types and ranges, and constructing it with them (what the runner does per cell) must not raise either —
    ``UsageError`` or ``ValueError`` in one line."""
    registry = host.strategies()
    for name, opts in options.items():
        cls = registry.get(name)  # unknown strategy: did you mean …
        if name not in strategies:
            raise UsageError(f"--set {name}.{next(iter(opts))}: strategy {name!r} is not in this run "
                             f"({', '.join(strategies)}); add it to --strategies or drop the --set")
        known = tuple(cls.option_names())
        for option in opts:
            if option not in known:
                near = closest(option, known)
                hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
                raise UsageError(f"--set {name}.{option}: strategy {name!r} has no option {option!r}; {hint}"
                                 f"it accepts: {', '.join(known) or 'none'}")
        try:
            cls.validate_options(dict(opts))
            cls(**opts)
        except UsageError as err:
            raise UsageError(f"--set {_pairs(name, opts)}: {err}") from None
        except (TypeError, ValueError) as err:
            raise UsageError(f"--set {_pairs(name, opts)}: {type(err).__name__}: {err}; see the strategy's "
                             f"options in `specterbench list`") from None


def _pairs(name: str, opts: dict) -> str:
    return " ".join(f"{name}.{k}={v}" for k, v in opts.items())


def context_tokens(engine) -> int | None:
    """The most positions the model attends to (``max_position_embeddings``), or None when its config says not."""
    value = getattr(engine.model.config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def check_context(engine, prompts, new_tokens: int) -> None:
    """Refuse prompt + new tokens beyond the model's context (it would run for minutes past it, then fail)."""
    limit = context_tokens(engine)
    if limit is None or not prompts:
        return
    longest = max(len(ids) for _, ids in prompts)
    if longest + new_tokens > limit:
        raise UsageError(f"--tokens {new_tokens}: the longest prompt ({longest} tokens) plus {new_tokens} new "
                         f"tokens exceeds {engine.name}'s context of {limit} positions; use --tokens "
                         f"{max(limit - longest, 0)} or less")


ACTIVATION_SLACK_BYTES = 512 * 2**20  # allocator rounding, temporaries of a forward, the CUDA context's growth
SPECULATION_MARGIN = 33  # positions a verification may add at once (K ≤ 32, plus one)


def kv_activation_bytes(engine, longest_prompt: int, new_tokens: int) -> int:
    """An upper estimate of what a decode holds beside the weights: the KV cache of the longest request (plus a
    verification's K + 1 positions), the logits of a verification pass in fp32, a prefill's hidden states, and
    :data:`ACTIVATION_SLACK_BYTES`."""
    g = engine.own_geometry
    itemsize = torch.empty((), dtype=engine.compute_dtype).element_size()
    positions = longest_prompt + new_tokens + SPECULATION_MARGIN
    kv = 2 * g.layers * g.kv_heads * g.head_dim * positions * itemsize
    logits = max(longest_prompt, SPECULATION_MARGIN) * g.vocab * 4 * 2  # the pass's logits and their fp32 copy
    hidden = 8 * longest_prompt * max(g.hidden, 2 * g.expert_intermediate) * itemsize
    return kv + logits + hidden + ACTIVATION_SLACK_BYTES


def check_device_memory(engine, budgets, longest_prompt: int, new_tokens: int, free_bytes: int) -> None:
    """Every cell budget (``budgets``: (text, bytes), everything a strategy keeps on the device is inside it) plus
    :func:`kv_activation_bytes` fits in ``free_bytes`` (measured after the model's dense weights were placed):
    one line naming the largest budget that fits otherwise."""

    extra = kv_activation_bytes(engine, longest_prompt, new_tokens)
    total = engine.total_expert_bytes
    too_big = [(text, n) for text, n in budgets if n + extra > free_bytes]
    if not too_big:
        return
    text, n = too_big[-1]
    fits = max(0, free_bytes - extra)
    fix = (f"use --budgets {int(fits / total * 100)}% or less" if fits >= engine.min_budget_bytes()
           else "free device memory or use a smaller model")
    raise BudgetError(f"budget {text} ({_size(n)} of experts) plus {_size(extra)} of KV cache and activations does "
                      f"not fit in the {_size(free_bytes)} free on {engine.device} after the dense weights; the "
                      f"largest budget that fits is {fits / total:.1%} ({_size(fits)}): {fix}")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"
