"""The peer the `ddp` stage measures its wrappers against: PyTorch's own
`torch.nn.parallel.DistributedDataParallel` with its default 25 MiB buckets (gradients
all-reduced bucket by bucket as backward produces them), behind the stage's wrapper interface
(`TorchDDP`); answers.py sets it beside ours. Its reducer waits for
its all-reduces when backward ends, so its time after backward (`comm`) is near zero and the
wait sits in forward+backward: the step is what compares.
"""

from __future__ import annotations

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
