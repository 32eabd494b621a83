"""Counting what one decode forward of an engine's model launches: the dense parts' kernels per MoE layer, per
dense layer and per forward, which the cost model prices (the experts are the engine's own and counted apart)."""

from __future__ import annotations

from dataclasses import replace

import torch

from specterbench.engine.graphs import REPLAY_LAUNCHES, capturable_pieces
from specterbench.engine.kernels import DEFAULT_KERNELS, KernelCounts, LaunchCounter
from specterbench.engine.seam import OffloadedExperts


def count_model_launches(engine) -> KernelCounts:
    """Count the dense parts of one decode forward of ``engine``'s model (experts stood in for, not counted):
    per MoE layer, per dense layer, and per forward. Runs one 2-token prefill and one counted 1-token step."""
    model = engine.model
    layers = _decoder_layers(model)
    moe_ids = {id(b) for b in _moe_blocks_of(engine)}
    kinds = ["moe" if any(id(m) in moe_ids for m in layer.modules()) else "dense" for layer in layers]
    counter = LaunchCounter()
    handles = []
    replay_launches = [0]  # eager launches the capturable pieces' replays would add

    def enter(kind):
        def hook(module, args):
            counter._section.append(kind)
        return hook

    def leave(module, args, output):
        counter._section.pop()

    def leave_piece(module, args, output):
        counter._section.pop()
        if LaunchCounter.active is counter:
            replay_launches[0] += REPLAY_LAUNCHES

    for layer, kind in zip(layers, kinds):
        handles.append(layer.register_forward_pre_hook(enter(kind)))
        handles.append(layer.register_forward_hook(leave))
    for block in _moe_blocks_of(engine):
        for _, piece in capturable_pieces(block):
            handles.append(piece.register_forward_pre_hook(enter("captured")))
            handles.append(piece.register_forward_hook(leave_piece))

    def stand_in(layer, act_fn, hidden, top_k_index, top_k_weights):
        with counter.paused():
            return torch.zeros_like(hidden)

    saved, engine.expert_override = engine.expert_override, stand_in
    try:
        with torch.inference_mode():
            kv = engine.new_kv_cache()
            ids = torch.zeros(1, 2, dtype=torch.long, device=engine.device)
            engine.model(input_ids=ids, use_cache=True, logits_to_keep=1, **{engine.cache_kwarg: kv})
            with counter:
                out = engine.model(input_ids=ids[:, :1], use_cache=True, logits_to_keep=1,
                                   **{engine.cache_kwarg: kv})
                out.logits[0].float()
    finally:
        engine.expert_override = saved
        for h in handles:
            h.remove()
    n_moe, n_dense = kinds.count("moe"), kinds.count("dense")
    captured = counter.sections.get("captured", 0)
    moe = counter.sections.get("moe", 0) + captured
    dense = counter.sections.get("dense", 0)
    outside = counter.total - moe - dense
    return replace(DEFAULT_KERNELS, moe_layer_dense=round(moe / max(1, n_moe)),
                   moe_layer_captured=round(captured / max(1, n_moe)),
                   moe_layer_pieces=round(replay_launches[0] / max(1, n_moe)),
                   dense_layer=round(dense / n_dense) if n_dense else DEFAULT_KERNELS.dense_layer,
                   forward=outside, counted_on=getattr(model.config, "model_type", type(model).__name__))


def _decoder_layers(model) -> list:
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return list(layers)
    return []


def _moe_blocks_of(engine) -> list:
    return [m for m in engine.model.modules() if isinstance(getattr(m, "experts", None), OffloadedExperts)]
