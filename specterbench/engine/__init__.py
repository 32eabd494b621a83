"""The engine: execute and price one offloaded MoE forward pass. It imports nothing of the project above it.

- engine.py: the Engine (decode loop, the MoE seam's entry); moe_layer.py: one MoE layer in its phases;
  residency.py: what a strategy may do to the cache; cache.py / pool.py: the byte-budgeted device cache and its
  slots; routing.py: a layer's routing as the host reads it; seam.py / store.py: the transformers seam and the host
  expert store; fused.py: fused norms swapped into the model.
- clocks.py (the Clock protocol and the modeled clock), host_clock.py and cuda_clock.py (the measured ones),
  scheduler.py (the one copy scheduler), costs.py (the one cost model), geometry.py and profiles.py (what a modeled
  clock prices), kernels.py and launch_count.py (what the engine launches, counted), graphs.py (captured decode).
- Low-bit weights: lowbit.py (kernels as they run), packing.py (packed codes), draft.py and dense_copy.py (the
  self-draft's copies), precision.py (the target's own precision).
- sampling.py: greedy and Gumbel-max coupled sampling.
"""
