"""The machine's cost model that every stage's estimate reads (planning/estimate.py: `Costs`):
a model step's seconds from its FLOPs at the rate the device reaches (or its kernel launches,
where those take longer), its memory, and what building or compiling a model costs. The
constants are a `Device`'s (budget/devices.py); the FLOP and memory formulas core/costs.py's.
No torch: the sizes come from planning/edition.py's reading of model.py.
"""

from __future__ import annotations

from dataclasses import dataclass

from cs336_systems.budget.devices import Device
from cs336_systems.core import costs
from cs336_systems.planning.edition import DEFAULT_EDITION, SRC, size_table
from cs336_systems.planning.imports import module_literal

VOCAB_SIZE = module_literal(SRC, "cs336_systems.model", "VOCAB_SIZE")
# forwards' worth of launches per mode (backward about twice a forward, the optimizer a half)
# what the estimate takes a model of one's own to cost (its factory's module is not built while
# planning)
OWN_MODEL_ESTIMATED_AS = "small"
LAUNCHES = {"forward": 1.0, "forward_backward": 3.0, "train_step": 3.5}


@dataclass(frozen=True)
class CostModel:
    """`Costs` on one machine (`dev`) for one edition's model sizes; `stages`: the run's."""

    dev: Device
    edition: int = DEFAULT_EDITION
    stages: tuple[str, ...] = ()

    def spec(self, size: str) -> dict[str, int]:
        """A size's dimensions; a name outside the table (an own model, planning/own_model.py:
        no torch here to build it) is estimated as the table's smallest course size."""
        table = size_table(self.edition)
        return table.get(size) or table[OWN_MODEL_ESTIMATED_AS]

    def layers(self, size: str) -> int:
        return self.spec(size)["num_layers"]

    def params(self, size: str) -> float:
        s = self.spec(size)
        return costs.param_count(VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"])

    def rate(self, precision: str) -> float:
        return self.dev.tflops.get(precision, self.dev.tflops["fp32"]) * 1e12

    def flops(self, size: str, ctx: int, batch: int, mode: str) -> float:
        s = self.spec(size)
        return costs.model_flops(
            VOCAB_SIZE, s["d_model"], s["num_layers"], s["d_ff"], batch, ctx, mode
        )

    def step_s(self, size: str, ctx: int, batch: int, mode: str, precision: str) -> float:
        launches = self.dev.launch_s_per_layer * self.layers(size) * LAUNCHES.get(mode, 3.5)
        return max(self.flops(size, ctx, batch, mode) / self.rate(precision), launches)

    def _memory(self, size: str, ctx: int, batch: int, mode: str, precision: str) -> dict:
        s = self.spec(size)
        return costs.step_memory_bytes(VOCAB_SIZE, s["d_model"], s["num_layers"],
                                       s["num_heads"], s["d_ff"], batch, ctx, mode, precision)  # fmt: skip

    def step_gib(self, size: str, ctx: int, batch: int, mode: str, precision: str) -> float:
        return self._memory(size, ctx, batch, mode, precision)["total_bytes"] / 2**30

    def state_and_activations_gib(
        self, size: str, ctx: int, batch: int, precision: str
    ) -> tuple[float, float]:
        b = self._memory(size, ctx, batch, "train_step", precision)
        return b["state_bytes"] / 2**30, b["activation_bytes"] / 2**30

    def fits(self, gib: float, factor: float = 1.0) -> bool:
        return self.dev.memory_gib is None or gib <= factor * self.dev.memory_gib

    def build_s(self, size: str, n: int = 1) -> float:
        return n * self.dev.build_s_per_gparam * self.params(size) / 1e9

    def compile_s(self, size: str) -> float:
        return self.dev.compile_s + self.dev.compile_s_per_layer * self.layers(size)

    def too_costly(
        self, size: str, ctx: int, batch: int, mode: str, precision: str, steps: int, limit
    ) -> bool:
        if not limit:
            return False
        peaks = self.dev.peak_tflops or self.dev.tflops
        peak = peaks.get(precision, self.dev.tflops["fp32"]) * 1e12
        return steps * self.flops(size, ctx, batch, mode) / peak > limit

    def train_step_flops(
        self, vocab: int, d_model: int, layers: int, d_ff: int, batch: int, ctx: int
    ) -> float:
        return costs.train_step_flops(vocab, d_model, layers, d_ff, batch, ctx)
