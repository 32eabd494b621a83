from specterbench.errors import BudgetError
from specterbench.strategy import Strategy


class Resident(Strategy):
    """Every expert on the device: the reference floor when the model fits. Reported once at 100%."""

    name = "resident"
    version = "1"
    description = "all experts resident (reference; needs 100% of expert bytes)"
    fixed_budget_fraction = 1.0

    def min_cache_bytes(self, engine):
        return engine.total_expert_bytes

    def prepare(self, engine, calibration=None):
        for layer in range(engine.num_layers):
            for e in range(engine.num_experts):
                if not engine.prefetch((layer, e)):
                    raise BudgetError("resident needs 100% of expert bytes on the device")
