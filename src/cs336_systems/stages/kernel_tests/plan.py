"""What the workflow needs to plan the kernel_tests stage's job, from the stage's config block."""

from __future__ import annotations

import shlex


def kernel_args(cfg: dict) -> str:
    """--kernel NAME=REGEX arguments, shell-quoted (the regexes hold | and ^)."""
    return " ".join(
        shlex.quote(f"--kernel={name}={regex}") for name, regex in cfg["kernels"].items()
    )


def option(cfg: dict, key: str) -> str:
    """A pytest selection option (-k / -m expression), shell-quoted; '' when unset."""
    return shlex.quote(cfg[key])
