"""Captured decode on CUDA: the static pieces of each MoE layer replayed from CUDA graphs (``--cuda-graphs``).

What is captured, and why only that. A decode step of this engine cannot be captured whole: the expert op reads
the layer's routing on the host (which experts, which slots), may wait for copies, fetch, or run experts on the
host — data-dependent host decisions a graph cannot hold. The attention between two expert ops cannot be captured
either while the KV cache is a ``DynamicCache`` (it grows every step and is cropped after rejected speculative
tokens, so its tensors' addresses and shapes change). What has static shapes for a given token width T and reads
no cache is captured: each MoE layer's **router** and, in families that have them, its **shared experts**
(:func:`capturable_pieces`). One graph per (piece, T) with static input and output buffers, captured lazily the
first time a decode or verification forward of width T (at most :data:`MAX_WIDTH` tokens) reaches the piece on
CUDA; prefill stays eager. A replay copies its input in and launches the graph (:data:`REPLAY_LAUNCHES`).
Capturing attention too would need a static KV cache, which the engine does not use (docs/gpu.md, CUDA graphs).

Every other kernel stays eager, and the modeled clock prices exactly that (``CostModel.dense_layer(captured=
True)``: the pieces' kernels as graph nodes at ``graph_node_us``, one launch per replay, the rest at
``launch_us``). When capture is off, unavailable (no CUDA) or fails, nothing is wrapped and everything is eager
and priced as eager: the run says why in one line and in the row (``cuda_graphs``, ``cuda_graphs_reason``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from specterbench.engine.kernels import LaunchCounter
from specterbench.errors import UsageError

SETTINGS = ("auto", "off")
MAX_WIDTH = 64  # widest forward captured: T = 1 decode, and verification of up to 63 drafted tokens


@dataclass(frozen=True, slots=True)
class GraphState:
    """Whether this cell's decode replays CUDA graphs: ``mode`` is ``used``, ``off`` or ``unavailable``."""

    mode: str
    reason: str

    @property
    def used(self) -> bool:
        return self.mode == "used"


EAGER = GraphState("off", "no cell set up")


def check_setting(setting: str) -> str:
    if setting not in SETTINGS:
        raise UsageError(f"--cuda-graphs {setting!r}: use one of {', '.join(SETTINGS)}")
    return setting


def capturable_pieces(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """The parts of a MoE block that take the layer's [T, H] tokens alone and have static shapes for a given T:
    its router, and its shared experts where the family has them (Qwen2-MoE, DeepSeek). Qwen2-MoE's shared-expert
    gate is one linear: its replay (:data:`REPLAY_LAUNCHES`) would cost more launches than it saves."""
    names = ("gate" if getattr(block, "gate", None) is not None else "router", "shared_expert", "shared_experts")
    return [(n, getattr(block, n)) for n in names if isinstance(getattr(block, n, None), nn.Module)]


#: eager launches a replay adds around its graph: the input's copy into the static buffer, and the replay
REPLAY_LAUNCHES = 2


class Replay:
    """One captured graph of a piece at one input shape: copy the input into its static buffer, replay, return the
    static outputs. They stay valid until this graph's next replay — the same MoE layer's next forward of this
    width — so the routing a layer hands its experts (``engine.routing``) is the layer's own while it runs (a
    strategy that keeps routing tensors past its layer must copy them; the built-in ones keep host lists)."""

    def __init__(self, graph, static_in: torch.Tensor, static_out):
        self.graph, self.static_in, self.static_out = graph, static_in, static_out

    def __call__(self, hidden: torch.Tensor):
        self.static_in.copy_(hidden)
        self.graph.replay()
        return self.static_out


def capture_cuda_graph(piece: nn.Module, example: torch.Tensor) -> Replay:  # pragma: no cover - needs CUDA
    """Capture ``piece(example)`` as a CUDA graph: warm it up on a side stream (as torch's docs require), then
    capture with thread-local error mode (the copy stream keeps working meanwhile)."""
    static_in = example.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            piece(static_in)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        static_out = piece(static_in)
    return Replay(graph, static_in, static_out)


class CapturedPiece(nn.Module):
    """Stands in for a capturable piece: decode-width calls replay its graph for that width (captured on first
    use), anything else (prefill, widths over :data:`MAX_WIDTH`) runs the piece eagerly."""

    def __init__(self, piece: nn.Module, controller: "GraphController"):
        super().__init__()
        self.piece = piece
        self.controller = controller
        self.replays: dict[tuple[int, ...], Replay] = {}  # by input shape

    def forward(self, hidden: torch.Tensor):  # [T, H] (or [1, T, H]: DeepSeek's shared experts)
        if not self.controller.replays(hidden.numel() // hidden.shape[-1]):
            return self.piece(hidden)
        key = tuple(hidden.shape)
        replay = self.replays.get(key)
        if replay is None:
            replay = self.replays[key] = self.controller.capture(self.piece, hidden)
        return replay(hidden)


class GraphController:
    """Sets up capture for one engine (:meth:`setup`), says which forwards replay (:meth:`replays`) and undoes it
    (:meth:`remove`)."""

    def __init__(self, engine, capture: Callable = capture_cuda_graph):
        self.engine = engine
        self._capture = capture
        self.state = EAGER
        self._wrapped: list[tuple[nn.Module, str, nn.Module]] = []  # (block, attribute, original piece)

    def setup(self, setting: str, cuda: bool | None = None) -> GraphState:
        """Apply ``--cuda-graphs setting``: ``off`` → eager; ``auto`` → the pieces are wrapped on CUDA (capture
        happens on first use; a failure there turns graphs off for the rest of the run); elsewhere eager with
        the reason. ``cuda`` overrides the device check (tests of the capture path on CPU with a fake capture)."""
        self.remove()
        check_setting(setting)
        cuda = self.engine.device.type == "cuda" if cuda is None else cuda
        if setting == "off":
            self.state = GraphState("off", "--cuda-graphs off")
        elif not cuda:
            self.state = GraphState("unavailable", f"no CUDA (device {self.engine.device.type})")
        else:
            for block in self.engine.moe_blocks:
                for name, piece in capturable_pieces(block):
                    setattr(block, name, CapturedPiece(piece, self))
                    self._wrapped.append((block, name, piece))
            self.state = GraphState("used", f"router and shared experts per MoE layer, T <= {MAX_WIDTH}")
        return self.state

    def replays(self, T: int) -> bool:
        """Whether a forward of ``T`` tokens replays graphs: a decode or verification forward (not prefill) of
        at most :data:`MAX_WIDTH` tokens while capture is in use, over the target's own dense weights (a draft's
        low-bit dense copy swaps linears' forwards, which a graph would not see), and no launch counter is watching
        (its ``TorchDispatchMode`` cannot see inside a replay)."""
        e = self.engine
        return (self.state.used and T <= MAX_WIDTH and e.context_len > e.forward_tokens
                and LaunchCounter.active is None
                and e.dense_kernel is e.precision.dense_kernel and e.dense_ratio == e.precision.dense_ratio)

    def capture(self, piece: nn.Module, example: torch.Tensor) -> Replay | Callable:
        """Capture ``piece`` at ``example``'s width; on any failure say why in one line, restore every piece and
        run eagerly from here on (this call included)."""
        try:
            return self._capture(piece, example)
        except Exception as exc:  # noqa: BLE001 - any capture failure means: continue eagerly, and say why
            reason = f"capture failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            print(f"specterbench: CUDA graphs off, {reason}; decoding continues eagerly", file=sys.stderr)
            self.remove()
            self.state = GraphState("unavailable", reason)
            return piece

    def reset(self) -> None:
        """Eager again, as before :meth:`setup` (a cell ends)."""
        self.remove()
        self.state = EAGER

    def remove(self) -> None:
        """Put every original piece back (graphs and their buffers are freed with the wrappers)."""
        for block, name, piece in self._wrapped:
            setattr(block, name, piece)
        self._wrapped = []
