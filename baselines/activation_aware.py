import torch

from .lru import LRU


class ActivationAware(LRU):
    """MoE-Infinity-style activation-aware prefetch and eviction.

    Each request keeps its expert activation matrix (EAM: tokens routed to each (layer, expert) so far). Before
    each layer it finds the calibration sequence whose EAM is most similar (cosine) and reads, from that
    sequence's EAM, how likely each expert of the next ``lookahead`` layers is; it prefetches the likeliest
    ones and, when room is needed, evicts the expert with the lowest predicted reuse.
    """

    name = "activation-aware"
    version = "1"
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
        self.flat = torch.nn.functional.normalize(self.library.flatten(1), dim=1)  # [N, L*E]

    def on_request_start(self, request):
        self.eam = torch.zeros(self.engine.num_layers, self.engine.num_experts)
        self.prediction = self.library.mean(0)  # before any routing: the average calibration sequence

    def before_layer(self, layer, experts, tokens_per_expert):
        engine = self.engine
        self.eam[layer, experts] += torch.tensor(tokens_per_expert, dtype=torch.float)
        current = torch.nn.functional.normalize(self.eam.flatten(), dim=0)
        best = int(torch.argmax(self.flat @ current))
        self.prediction = self.library[best]  # [L, E]
        protect = {(layer, e) for e in experts}
        for step in range(1, self.lookahead + 1):
            nxt = (layer + step) % engine.num_layers  # past the last layer comes the next token's first
            likely = torch.argsort(self.prediction[nxt], descending=True)[: self.width].tolist()
            for rank, e in enumerate(likely):
                key = (nxt, e)
                protect.add(key)
                if key in engine.cache or self.prediction[nxt, e] <= 0:
                    continue
                if not engine.make_room(engine.expert_bytes, protect=protect, needed=key):
                    return
                engine.prefetch(key, priority=float(-step - rank / 100))

    def pick(self, keys):
        return min(keys, key=lambda k: float(self.prediction[k]))  # lowest predicted reuse; ties: LRU
