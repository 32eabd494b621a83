"""The model catalog: what ``--model NAME`` resolves to.

models.py (model specs: the shipped stand-ins, tiny random models, real presets and local checkpoints by name),
embedded.py (the stand-ins shipped in ``stand_ins/``, their loader and draft-fidelity calibration), drafts.py (the
small dense drafts spec-small proposes with), tiny.py (tiny random models of every supported family), checkpoint.py (a
local Hugging Face checkpoint loaded with host memory about its own size), corpus.py (the public-domain text the
stand-ins are trained and measured on).
"""
