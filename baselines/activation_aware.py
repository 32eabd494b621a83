import torch

from .lru import LRU


class ActivationAware(LRU):
    """MoE-Infinity-style activation-aware prefetch and eviction.

    Each request keeps its expert activation matrix (EAM: tokens routed to each (layer, expert) so far). Before
    each layer it finds the calibration sequence whose EAM is most similar (cosine) and reads, from that
    sequence's EAM, how likely each expert of the next ``lookahead`` layers is; it prefetches the likeliest
    ones and, when room is needed, evicts the expert with the lowest predicted reuse.

    The similarity is kept incrementally: a layer adds its routed counts to one dot product per calibration
    sequence (O(sequences × routed experts)), never a pass over the whole EAM.
    """

    name = "activation-aware"
    version = "3"  # 3: a prompt's misses fetched again, as lru (2: the engine's per-layer prefill rule)
    description = "MoE-Infinity: match the request's expert activation matrix to calibration ones; prefetch/evict"
    uses_calibration = True

    @classmethod
    def option_names(cls):
        return ("lookahead", "width")

    def prepare(self, engine, calibration=None):
        self.lookahead = int(self.options.get("lookahead", 2))
        self.width = int(self.options.get("width", engine.top_k))  # experts prefetched per predicted layer
        if calibration is None or not calibration.sequences:
            raise ValueError("activation-aware needs calibration sequences")
        eams = torch.stack([s.float() for s in calibration.sequences])  # [N, L, E]
        self.library = eams / eams.sum(-1, keepdim=True).clamp_min(1)  # per-layer routing distributions
        norms = self.library.flatten(1).norm(dim=1).clamp_min(1e-12)  # [N]
        self.unit = self.library / norms[:, None, None]  # [N, L, E]: rows of the normalised library
        self.mean = self.library.mean(0)  # [L, E]
        # the most likely experts of every (sequence, layer), computed once: [N, L, width]
        self.ranked = torch.argsort(self.library, dim=-1, descending=True)[..., : self.width]

    def on_request_start(self, request):
        self.dots = torch.zeros(self.unit.shape[0])  # [N]: library_n · EAM / |library_n|
        self.prediction = self.mean  # before any routing: the average calibration sequence
        self.ranking = torch.argsort(self.mean, dim=-1, descending=True)[..., : self.width]  # [L, width]

    def before_layer(self, layer, experts, tokens_per_expert):
        engine = self.engine
        counts = torch.tensor(tokens_per_expert, dtype=torch.float)  # [n]
        self.dots += self.unit[:, layer, experts] @ counts  # cosine up to the EAM's norm, equal for every n
        best = int(torch.argmax(self.dots))
        self.prediction, self.ranking = self.library[best], self.ranked[best]  # [L, E], [L, width]
        protect = {(layer, e) for e in experts}
        for step in range(1, self.lookahead + 1):
            nxt = (layer + step) % engine.num_layers  # past the last layer comes the next token's first
            for rank, e in enumerate(self.ranking[nxt].tolist()):
                key = (nxt, e)
                protect.add(key)
                if key in engine.cache or self.prediction[nxt, e] <= 0:
                    continue
                if not engine.make_room(engine.expert_bytes, protect=protect, needed=key):
                    return
                engine.prefetch(key, priority=float(-step - rank / 100))

    def pick(self, keys):
        return min(keys, key=lambda k: float(self.prediction[k]))  # lowest predicted reuse; ties: LRU
