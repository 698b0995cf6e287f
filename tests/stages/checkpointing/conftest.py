"""The checkpointing tests' own fixture."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_thread():
    """torch on one thread for the test: its models are tiny, and threads only add contention
    on a shared 2-core machine (`pytestmark = pytest.mark.usefixtures("one_thread")`)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
