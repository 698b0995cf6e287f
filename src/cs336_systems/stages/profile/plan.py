"""What the workflow needs to check the profile stage's config block (no torch)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from cs336_systems.core.config import Checker, Facts


def nsys_problem(setting: str) -> str | None:
    """Why `setting` (the config's `nsys`: a path or a name on PATH) is no usable nsys."""
    if not setting:
        return None
    path = Path(setting).expanduser()
    if (path.is_file() and os.access(path, os.X_OK)) or shutil.which(setting):
        return None
    return "an executable nsys (a path, or a name on PATH); empty: $NSYS, then PATH"


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    at.sizes("sizes", cfg["sizes"], facts)
    probe = cfg.get("probe")
    if cfg["context_lengths"] == "probe" and not probe:
        at.fail("probe", None, "a probe block (start, max, mode, above, count) for `probe`")
    if probe:
        at.at("probe").at_most("start", probe["start"], "max", probe["max"])
    nsys = cfg.get("nsys", "")
    if any(c in nsys for c in "\n\r\0"):
        at.fail("nsys", nsys, "a path on one line")
    elif facts.running and facts.gpus and "profile" in facts.stages and (why := nsys_problem(nsys)):
        # where the run happens here (a GPU is visible), the path must be this host's nsys
        at.fail("nsys", nsys, why)
