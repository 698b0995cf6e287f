"""A model of your own through the study (docs/own-model.md): the config's `own_model` key

    own_model: {name: my-gpt2, factory: "package.module:function",
                batch: "package.module:function", flops_per_token: 1.2e8}

names a factory; `name` becomes one more model size in the grids of the stages that run an
arbitrary module (`STAGES`). While planning: the name added to those grids (`add_to_grids`),
the factory refused before any job where it cannot be imported or called, returns no
nn.Module or one without parameters (`factory_problems`: core/own_model.py in a process of
its own, planning loads no torch), and the key handed to the jobs (`ENV`, `export`).
Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

KEY = "own_model"
# the jobs' copy of the key, as JSON (core/own_model.py reads it)
ENV = "CS336_OWN_MODEL"
# the stages that run an arbitrary module: the own model is one more size of their `sizes`
# (checkpointing, ddp and fsdp run one `size`: the own model's name there runs it instead)
STAGES = ("benchmark", "memory", "profile")
SRC = Path(__file__).resolve().parents[2]
CHECK_TIMEOUT_S = 300


def spec_of(config: Mapping) -> dict | None:
    """The config's `own_model` mapping, or None where the run studies none."""
    spec = config.get(KEY)
    return dict(spec) if isinstance(spec, Mapping) else None


def add_to_grids(config: dict, stage_names) -> None:
    """Append the own model's name to `sizes` of every preset block of the `STAGES` the run
    has (in place; before the check, so every block's check sees it)."""
    spec = spec_of(config)
    name = spec.get("name") if spec else None
    if not isinstance(name, str):
        return
    for stage in (s for s in STAGES if s in stage_names):
        for block in (config.get(stage) or {}).values():
            sizes = block.get("sizes") if isinstance(block, dict) else None
            if isinstance(sizes, list) and name not in sizes:
                sizes.append(name)


def factory_problems(spec: Mapping, timeout_s: float = CHECK_TIMEOUT_S) -> list[tuple]:
    """(key path, value, what is allowed) of each problem of the factories: each is imported
    and the model built on the meta device (no memory, no weights) by `python -m
    cs336_systems.core.own_model check` in a process of its own."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    cmd = [sys.executable, "-m", "cs336_systems.core.own_model", "check", json.dumps(dict(spec))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return [
            (
                (KEY, "factory"),
                spec.get("factory"),
                f"a factory that builds within {timeout_s:.0f} s",
            )
        ]
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return [((KEY, "factory"), spec.get("factory"), f"a factory the check can load ({why})")]
    return [((KEY, p["key"]), p["value"], p["allowed"]) for p in found]


def export(config: Mapping) -> None:
    """Hand the key to the jobs (their environment: `ENV`), or clear a stale one."""
    spec = spec_of(config)
    if spec is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = json.dumps(spec)
