import math

from specterbench.errors import BudgetError, UsageError

from .host_experts import HostExperts


class NCpuMoe(HostExperts):
    """llama.cpp's layer split (``--n-cpu-moe N``; ``n=all`` is ``--cpu-moe``): every routed expert of the first
    ``n`` MoE layers stays in host memory and runs on the host CPU; the other layers' experts are all resident; the
    dense part (attention, routers, shared experts, KV cache) is the device's. Nothing is copied during decode.

    ``n=fit`` takes the smallest ``n`` whose resident layers fit the budget (llama.cpp's ``--fit``). ``n`` counts the
    priced model's MoE layers. Under a projection each of the stand-in's layers stands for ``layer_scale`` real ones,
    so the boundary between host and device layers can fall inside a stand-in layer: that layer keeps the share of
    its experts that its resident real layers would (the lowest ids: a position, not a popularity), so the split
    moves one real layer at a time, as llama.cpp's does.
    """

    name = "n-cpu-moe"
    version = "2"  # 2: the split in real layers under a projection (a partial stand-in layer), the stream buffer one
    # real layer's experts
    description = "llama.cpp --n-cpu-moe N / --cpu-moe: the first N MoE layers' experts on the host, the rest resident"

    @classmethod
    def option_names(cls):
        return ("n", *super().option_names())

    @classmethod
    def validate_options(cls, options: dict) -> None:
        super().validate_options(options)
        n = str(options.get("n", "fit"))
        if n not in ("fit", "all"):
            try:
                ok = int(n) >= 0
            except ValueError:
                ok = False
            if not ok:
                raise UsageError(f"n-cpu-moe option n={options.get('n')!r} is invalid: give a number of MoE layers "
                                 f"(0 ... all), 'fit' (the fewest that leave the rest within the budget) or 'all'")

    @classmethod
    def resident_experts_for(cls, engine, real_host_layers: int) -> int:
        """Stand-in experts resident when the first ``real_host_layers`` of the priced model's MoE layers are the
        host's: the rest's share of every expert."""
        real = real_moe_layers(engine)
        total = engine.num_layers * engine.num_experts
        return math.ceil(total * (real - min(real, real_host_layers)) / real) if real else 0  # enough for them all

    @classmethod
    def check_budget(cls, engine, budget_bytes: int, options: dict) -> None:
        n = str(options.get("n", "fit"))
        real = real_moe_layers(engine)
        if n not in ("fit", "all") and int(n) > real:
            raise UsageError(f"n-cpu-moe option n={n} is more than the {real} MoE layers of {engine.geometry.name}; "
                             f"give 0 ... {real}, or all")
        if n in ("fit", "all"):
            return
        need = cls.resident_experts_for(engine, int(n)) * engine.expert_bytes
        need += cls.min_budget(engine, options)  # a forced stream's buffer
        if budget_bytes < need:
            raise BudgetError(f"n-cpu-moe with n={n} keeps {real - int(n)} MoE layer(s) of experts resident "
                              f"({need} bytes, {need / engine.total_expert_bytes:.1%} of expert bytes), more than the "
                              f"budget's {budget_bytes}; raise the budget, or give a larger n or n=fit")

    def fit_budget(self, engine, budget_bytes: int) -> None:
        real = real_moe_layers(engine)
        n = str(self.options.get("n", "fit"))
        if n == "all":
            self.real_host_layers = real
        elif n == "fit":  # the fewest host layers whose complement fits beside the stream buffer
            room = budget_bytes - self.stream_slots_bytes(engine)
            self.real_host_layers = next((h for h in range(real + 1)
                                          if self.resident_experts_for(engine, h) * engine.expert_bytes <= room), real)
        else:
            self.real_host_layers = int(n)
        self.resident_experts = self.resident_experts_for(engine, self.real_host_layers)
        if (self.real_host_layers == real and n == "fit" and budget_bytes < self.stream_slots_bytes(engine)
                and self.prefill in ("auto", "priced")):
            self.prefill = "host"

    def planned_pins(self, engine) -> set:
        """Whole layers from the last one down; the boundary layer's share by lowest expert id."""
        E, pins = engine.num_experts, set()
        for i in range(self.resident_experts):
            layer = engine.num_layers - 1 - i // E
            pins.add((layer, i % E))
        return pins

    def min_cache_bytes(self, engine):
        pins = len(self.planned_pins(engine)) * engine.expert_bytes
        return pins + (self.stream_slots_bytes(engine) if self.prefill == "stream" else 0)

    def prepare(self, engine, calibration=None):
        self.pinned = self.planned_pins(engine)
        for key in sorted(self.pinned):
            engine.prefetch(key)

    def metrics(self):
        m = super().metrics()
        m.update({"n_cpu_moe": self.real_host_layers, "moe_layers": real_moe_layers(self.engine),
                  "resident_share": round(self.resident_experts / (self.engine.num_layers * self.engine.num_experts),
                                          4)})
        return m


def real_moe_layers(engine) -> int:
    """The priced model's MoE layers (the stand-in's under its own geometry)."""
    g = engine.geometry
    return round(g.moe_layers * g.layer_scale)
