from specterbench.errors import BudgetError, UsageError

from .host_experts import HostExperts


class NCpuMoe(HostExperts):
    """llama.cpp's layer split (``--n-cpu-moe N``; ``n=all`` is ``--cpu-moe``): every routed expert of the first
    ``n`` MoE layers stays in host memory and runs on the host CPU; the other layers' experts are all resident; the
    dense part (attention, routers, shared experts, KV cache) is the device's. Nothing is copied during decode.

    ``n=fit`` takes the smallest ``n`` whose resident layers fit the budget (llama.cpp's ``--fit``). ``n`` counts the
    priced model's MoE layers; under a projection each of the stand-in's layers stands for several real ones, so the
    split moves in steps of that many (the row states both).
    """

    name = "n-cpu-moe"
    version = "1"
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
    def check_budget(cls, engine, budget_bytes: int, options: dict) -> None:
        n = str(options.get("n", "fit"))
        real = real_moe_layers(engine)
        if n not in ("fit", "all") and int(n) > real:
            raise UsageError(f"n-cpu-moe option n={n} is more than the {real} MoE layers of {engine.geometry.name}; "
                             f"give 0 ... {real}, or all")
        if n == "fit":
            return
        host_layers = engine.num_layers if n == "all" else min(engine.num_layers, round(int(n) * engine.num_layers
                                                                                         / real))
        need = (engine.num_layers - host_layers) * engine.num_experts * engine.expert_bytes
        need += engine.num_experts * engine.expert_bytes if str(options.get("prefill", "auto")) == "stream" else 0
        if budget_bytes < need:
            raise BudgetError(f"n-cpu-moe with n={n} keeps {engine.num_layers - host_layers} MoE layer(s) of experts "
                              f"resident ({need} bytes, {need / engine.total_expert_bytes:.1%} of expert bytes), more "
                              f"than the budget's {budget_bytes}; raise the budget, or give a larger n or n=fit")

    def fit_budget(self, engine, budget_bytes: int) -> None:
        L, per_layer = engine.num_layers, engine.num_experts * engine.expert_bytes
        n = str(self.options.get("n", "fit"))
        if n == "all":
            self.host_layers = L
        elif n == "fit":
            room = budget_bytes - self.stream_slots_bytes(engine)
            resident = min(L, max(0, room) // per_layer) if per_layer else L
            self.host_layers = L - resident
        else:
            self.host_layers = min(L, round(int(n) * L / real_moe_layers(engine)))
        if self.host_layers == L and n == "fit" and budget_bytes < self.stream_slots_bytes(engine):
            self.prefill = "host" if self.prefill == "auto" else self.prefill

    def planned_pins(self, engine) -> set:
        return {(layer, e) for layer in range(self.host_layers, engine.num_layers) for e in range(engine.num_experts)}

    def min_cache_bytes(self, engine):
        pins = len(self.planned_pins(engine)) * engine.expert_bytes
        return pins + (self.stream_slots_bytes(engine) if self.prefill == "stream" else 0)

    def prepare(self, engine, calibration=None):
        self.pinned = self.planned_pins(engine)
        for key in sorted(self.pinned):
            engine.prefetch(key)

    def metrics(self):
        m = super().metrics()
        real = real_moe_layers(self.engine)
        m.update({"n_cpu_moe": round(self.host_layers * real / self.engine.num_layers), "moe_layers": real,
                  "host_layers_of_model": self.host_layers})
        return m


def real_moe_layers(engine) -> int:
    """The priced model's MoE layers (the stand-in's under its own geometry)."""
    g = engine.geometry
    return round(g.moe_layers * g.layer_scale)
