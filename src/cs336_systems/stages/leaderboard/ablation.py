"""The leaderboard's ablation rows: the engine with one optimization turned off per row, each
at the checkpointing the engine's own row ran (read from the stage's runs CSV), so that a row
changes one thing. Light (no torch): the analysis reads it too."""

from __future__ import annotations

from pathlib import Path

# the engine with one optimization turned off: the EngineOptions each row changes
ABLATIONS: dict[str, dict] = {
    "attention_ours": {"attention": "flash_triton"},  # our FlashAttention-2, not measured against
    "attention_cudnn": {"attention": "sdpa_cudnn"},  # SDPA's cuDNN, not measured against ours
    "sdpa": {"attention": "sdpa"},  # PyTorch's SDPA (its own backend choice)
    "plain_loss": {"loss": "plain"},  # full logits and F.cross_entropy instead of the fused loss
    "fsdp_per_layer": {"fsdp_units": "layer"},  # FSDP units of one Linear instead of a block
    "no_prefetch": {"prefetch": False},  # each gather when its unit runs
    "whole_blocks": {"selective": False},  # auto checkpointing of whole blocks only
    "every_1": {"checkpoint": "every_1"},  # every block checkpointed alone
    "every_2": {"checkpoint": "every_2"},  # pairs of blocks checkpointed
    "no_compile": {"compile": False},  # eager blocks
}


def pins_checkpointing(ablation: str, pinned: str) -> bool:
    """Whether an ablation row runs the engine row's checkpointing `pinned` (every row but those
    whose change is the checkpointing itself): a plan chosen afresh per row would move with the
    free memory and the measured block bytes, and the row's difference would mix two changes."""
    changes = ABLATIONS.get(ablation, {})
    return bool(pinned) and pinned != "auto" and not {"checkpoint", "selective"} & set(changes)


def engine_checkpointing(path: str) -> str:
    """The checkpointing the full configuration's engine row ran, from the stage's runs CSV
    (empty when that row did not run)."""
    if not path or not Path(path).exists():
        return ""
    from cs336_systems.core.results import read_csv

    df = read_csv(path)
    if "checkpointing" not in df:
        return ""
    rows = df[(df["config"] == "full") & (df["variant"] == "engine") & (df["status"] == "ok")]
    return str(rows["checkpointing"].iloc[0]) if len(rows) else ""
