"""The precision stage's knobs (`PrecisionKnobs`, one per preset block of
config/stages/precision.yaml); no torch: the workflow reads it while planning."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cs336_systems.planning.estimate import Costs, EtaKeys, Job, fixed_job
from cs336_systems.planning.knobs import Knobs, knob


@dataclass(frozen=True)
class PrecisionKnobs(Knobs):
    """Accumulation, autocast dtypes, LayerNorm."""

    devices: list[Literal["cpu", "cuda"]] = knob(
        "devices to run on; a device that is not present gives `skipped` rows",
        minItems=1,
        uniqueItems=True,
    )


# the stage's knobs: its config blocks are checked against their schema (planning/config.py)
KNOBS = PrecisionKnobs


# ---- the time budget's estimate (planning/estimate.py) -------------------------------------

ETA_KEYS: EtaKeys = {"precision": lambda w: "precision"}


def estimate(k: PrecisionKnobs, cost: Costs) -> list[Job]:
    """The accumulation snippets and the toy model: seconds whatever the block says."""
    return [fixed_job("precision", cost, "the accumulation snippets")]
