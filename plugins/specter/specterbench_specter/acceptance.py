"""What a speculative window accepts, and the acceptance figures a row reports: the rule that keeps decoding exact
(:func:`accepted_prefix`) and the per-position and per-token rates read off the windows' K and accepted lengths."""

from __future__ import annotations


def accepted_prefix(proposals: list[int], target: list[int]) -> int:
    """How many proposals the target accepts: the longest prefix equal to its own tokens.

    ``target[i]`` is the target's token after the last accepted one and ``proposals[:i]``; so
    ``len(target) == len(proposals) + 1`` and the window emits ``proposals[:a] + [target[a]]``.
    """
    a = 0
    while a < len(proposals) and proposals[a] == target[a]:
        a += 1
    return a


def acceptance_by_position(ks: list[int], accepted: list[int]) -> dict[str, float]:
    """Per drafted position i (1-based): of the windows that drafted at least i tokens and accepted the first
    i − 1, the share that accepted the i-th — the per-token acceptance as it varies along the window."""
    out = {}
    for i in range(1, max(ks, default=0) + 1):
        reached = sum(1 for k, a in zip(ks, accepted) if k >= i and a >= i - 1)
        if reached:
            out[str(i)] = sum(1 for k, a in zip(ks, accepted) if k >= i and a >= i) / reached
    return out


def per_token_acceptance(ks: list[int], accepted: list[int]) -> float | None:
    """Accepted drafts over drafted positions reached (accepted + one rejection per window that stopped early):
    the per-token acceptance α of a draft whose tokens are accepted independently, whatever the windows' K."""
    rejected = sum(1 for k, a in zip(ks, accepted) if a < k)
    total = sum(accepted) + rejected
    return sum(accepted) / total if total else None
