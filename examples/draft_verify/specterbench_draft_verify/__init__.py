"""Speculative decoding written outside specterbench: the shared quantized self-draft proposes ``k`` tokens, the
offloaded target verifies them in one forward pass, the KV cache is rolled back to what was accepted.

Everything it uses is public (docs/plugins.md, "Speculative strategies"):

- ``specterbench.engine.draft``: ``QuantSpec`` (bits, quantizer), ``quantized_bytes(engine, spec)`` (what the draft
  costs on the device, charged to the budget through ``device_bytes``) and ``shared_quantized(engine, spec)`` (the
  one quantized copy per engine and spec, callable in place of the offloaded cache);
- ``engine.forward(ids, kv, experts=draft)`` (a draft pass: resident low-bit experts, the strategy is not asked),
  ``engine.forward(ids, kv, all_logits=True)`` (a verification pass through the cache: logits [T, V]),
  ``engine.new_kv_cache()``, ``engine.rollback(kv, keep_tokens)``, ``engine.emit(n_tokens)``;
- ``request.sampler()``: ``pick(logits, position)`` / ``pick_many(logits, first_position)`` choose the token the
  reference would at each absolute position (greedy, or Gumbel-max noise tied to the position), so draft and
  target agree whenever their logits do, and every emitted token is the target's own: lossless in both modes.
"""

import torch

from specterbench import Strategy, hookimpl
from specterbench.engine.draft import QuantSpec, quantized_bytes, shared_quantized
from specterbench.errors import UsageError

__version__ = "0.1.0"


class DraftVerify(Strategy):
    name = "draft-verify"
    version = "1"
    description = "speculative decoding from outside the package: shared 4-bit draft proposes k, target verifies"

    @classmethod
    def option_names(cls):
        return ("k", "bits")

    def __init__(self, **options):
        super().__init__(**options)
        self.k = int(options.get("k", 3))
        if not 1 <= self.k <= 16:
            raise UsageError(f"draft-verify.k must be an integer from 1 to 16, got {self.k}")
        self.spec = QuantSpec.from_options(options)  # bits=4 (nf4) unless --set draft-verify.bits=8

    def device_bytes(self, engine):  # the draft is resident: the expert cache gets the budget minus this
        return quantized_bytes(engine, self.spec)

    def attach(self, engine):
        super().attach(engine)
        self.draft = shared_quantized(engine, self.spec)  # quantized once per engine, shared by cells
        self.on_warmup_end()

    def on_warmup_end(self):
        self.proposed = self.accepted = 0

    def generate(self, engine, request):
        sampler, n_new = request.sampler(), request.max_new_tokens
        seq = list(request.prompt_ids)  # seq[i] is the token at absolute position i
        kv = engine.new_kv_cache()  # between windows it holds every position of seq but the last
        logits = engine.forward(torch.tensor([seq]), kv)  # prefill through the offloaded cache
        out = [sampler.pick(logits[-1], len(seq))]
        seq.append(out[0])
        engine.emit(1)
        while len(out) < n_new:
            new = self.window(engine, sampler, seq, kv, min(self.k, n_new - len(out)))[: n_new - len(out)]
            seq += new
            out += new
            engine.emit(len(new))  # the tokens the user now has: one TPOT sample per window
            self.on_step_end(new)
        return out

    def window(self, engine, sampler, seq, kv, k):
        kept = kv.get_seq_length()  # == len(seq) - 1
        proposals, last = [], seq[-1]
        for i in range(k):  # the draft: resident quantized experts, no cache traffic
            draft_logits = engine.forward(torch.tensor([[last]]), kv, experts=self.draft)  # [1, V]
            last = sampler.pick(draft_logits[-1], len(seq) + i)
            proposals.append(last)
        engine.rollback(kv, kept)  # drop the draft's KV entries: the target writes its own
        logits = engine.forward(torch.tensor([[seq[-1]] + proposals]), kv, all_logits=True)  # [k + 1, V]
        target = sampler.pick_many(logits, len(seq))  # the target's own token at each position
        a = 0
        while a < k and proposals[a] == target[a]:
            a += 1
        engine.rollback(kv, kept + 1 + a)  # keep seq[-1] and the accepted proposals
        self.proposed += k
        self.accepted += a
        return proposals[:a] + [target[a]]  # the corrected token (or a bonus one when all agree)

    def metrics(self):
        return {"acceptance_rate": self.accepted / self.proposed if self.proposed else None}


@hookimpl
def specterbench_register_strategies(register):
    register(DraftVerify)
