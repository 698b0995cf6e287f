"""The peer the `ddp` stage measures its wrappers against: PyTorch's own
`torch.nn.parallel.DistributedDataParallel` with its default 25 MiB buckets (gradients
all-reduced bucket by bucket as backward produces them), behind the stage's wrapper interface
(`TorchDDP`), and the sentence that sets it beside ours (`peer_sentence`). Its reducer waits for
its all-reduces when backward ends, so its time after backward (`comm`) is near zero and the
wait sits in forward+backward: the step is what compares.
"""

from __future__ import annotations

import pandas as pd

from cs336_systems.core.analysis import fmt, ok

BUCKET_MB = 25.0  # DistributedDataParallel's default bucket_cap_mb


class TorchDDP:
    """`DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)` with the calls the stage's
    training step makes; `remove_hooks` drops it (its reducer removes its gradient hooks), so
    the model serves the next run as it was."""

    def __init__(self, model):
        from torch.nn.parallel import DistributedDataParallel

        self.ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_MB)
        self.sync_params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, *args, **kwargs):
        return self.ddp(*args, **kwargs)

    def on_train_batch_start(self) -> None:
        """Nothing to reset between steps."""

    def finish_gradient_synchronization(self) -> None:
        """Nothing left: the reducer waited for its all-reduces when backward ended."""

    def remove_hooks(self) -> None:
        import gc

        self.ddp = None
        gc.collect()


def peer_sentence(d: pd.DataFrame) -> str:
    """PyTorch's DDP beside per-parameter overlap and the fastest bucketed run (runs that passed
    the checks), or '' where either side is missing."""
    good = ok(d)
    peer = good[good["variant"] == "torch_ddp"]
    if not len(peer):
        return ""
    p = peer.iloc[0]
    ours = good[good["variant"].isin(["overlap", "bucketed"])]
    if not len(ours):
        return ""
    best = ours.loc[ours["step_ms_mean"].idxmin()]
    name = (
        f"bucketed {best.bucket_size_mb:g} MiB"
        if best.variant == "bucketed"
        else "overlap (per parameter)"
    )
    ratio = float(best.step_ms_mean) / float(p.step_ms_mean)
    return (
        f"The peer, PyTorch's DistributedDataParallel ({BUCKET_MB:g} MiB buckets), takes "
        f"{fmt(float(p.step_ms_mean))} ± {fmt(float(p.step_ms_std))} ms a step; our fastest, "
        f"{name}, {fmt(float(best.step_ms_mean))} ± {fmt(float(best.step_ms_std))} ms "
        f"({fmt(ratio)}× the peer's time)."
    )
