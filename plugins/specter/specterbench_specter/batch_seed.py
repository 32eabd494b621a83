"""Specter's governor at the cell's batch: the seed decodes calibration prompts B at a time (``engine.cell_batch``, set
by the runner before ``prepare``), and batched windows are forecast and fitted at their batch size
(:class:`~.governor.BatchFit`), their width and the requests' leads and remaining tokens known to the forecast."""

from __future__ import annotations

from specterbench.engine.batch import begin_batch
from specterbench.strategy import Request


class GovernedBatches:
    """Mixed into :class:`~.specter.Specter` before :class:`~.decoding.SpeculativeDecoding`: needs ``governor``."""

    cell_batch = 1  # requests the cell's measured batches decode together (``engine.cell_batch``)

    def seed(self, engine, calibration, i: int, tokens: int) -> None:
        """Seed window ``i``'s calibration decode at the cell's batch: one prompt at batch 1; at B > 1 the B longest
        calibration prompts (each repeated where there are fewer), cut to the shortest of them, decoded in batched
        windows, so the governor fits the batch's own windows (:class:`~.governor.BatchFit`)."""
        if self.cell_batch == 1:
            ids = calibration.prompts[i] if i < len(calibration.prompts) else None
            if ids is None:
                return
            request = Request(f"governor-seed-{i}", ids, tokens, decode=calibration.decode)
            engine.begin_request(request)
            self.generate(engine, request)
            return
        longest = sorted(calibration.prompts, key=len, reverse=True)
        prompts = [longest[j % len(longest)] for j in range(self.cell_batch)]
        n = min(len(p) for p in prompts)
        requests = [Request(f"governor-seed-{i}-{j}", tuple(p[:n]), tokens, decode=calibration.decode)
                    for j, p in enumerate(prompts)]
        begin_batch(engine, requests)
        self.generate_batch(engine, requests)

    def generate(self, engine, request):
        self.governor.batch = 1
        return super().generate(engine, request)

    def generate_batch(self, engine, requests):
        """Batched windows (:mod:`.batched`), forecast and fitted at their batch size."""
        self.governor.batch = len(requests)
        try:
            return super().generate_batch(engine, requests)
        finally:
            self.governor.batch, self.governor.width = 1, 1
            self.governor.leads = self.governor.remaining = None

    def batch_choose_k(self, seqs, remaining):
        """The window's least width for the forecast: the requests' most pending tokens (the request furthest
        behind has one; the others are ahead by what they accepted past it)."""
        lengths = [len(s) for s in seqs]
        g = self.governor
        g.width = max(lengths) - min(lengths) + 1
        g.leads, g.remaining = [n - min(lengths) for n in lengths], list(remaining)
        return super().batch_choose_k(seqs, remaining)
