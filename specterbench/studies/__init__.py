"""Studies of the shipped stand-ins: how they are trained (train, specs, tokenizer), whether they route like the
real models they stand for (realism, lrc, routing_stats), whether their quantized drafts err like real ones
(fidelity), their model cards (card) and the packaged prompt sets (make_workloads)."""
