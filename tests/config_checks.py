"""The config check on the real defaults with one override (planning/config.py:check_run), for
the tests of bad input: tests/unit/planning/test_config.py and the stages' own grid tests."""

from __future__ import annotations

import copy
import importlib
from functools import cache

import pytest
from pipeline_utils import ROOT

from cs336_systems.planning import config as cfg

DEFAULTS = cfg.load_yaml(ROOT / "config" / "config.yaml")
GB = 1024.0  # MiB


@cache
def setup():
    base = copy.deepcopy(DEFAULTS)
    stages = cfg.with_stage_defaults(base, ROOT / "config" / "stages")
    checks, knobs = {}, {}
    for stage in stages:
        try:
            plan = importlib.import_module(f"cs336_systems.stages.{stage}.plan")
        except ModuleNotFoundError:
            continue
        checks[stage] = getattr(plan, "check", None)
        knobs[stage] = getattr(plan, "KNOBS", None)
    return stages, cfg.load_schemas(ROOT / "workflow" / "schemas", stages, knobs), checks


def check(override: dict, gpus=(), host_memory_mib=None, **globals_):
    """check_run on the defaults with `override` merged over them (as --configfile does)."""
    stages, schemas, checks = setup()
    user = cfg.merge(copy.deepcopy(DEFAULTS), {"preset": "cpu", "machine": "auto", **globals_})
    user = cfg.merge(user, copy.deepcopy(override))
    cfg.with_stage_defaults(user, ROOT / "config" / "stages")
    return cfg.check_run(user, schemas, checks, list(gpus), host_memory_mib), user


def problems(override: dict, **kw) -> list[str]:
    with pytest.raises(cfg.ConfigError) as err:
        check(override, **kw)
    lines = str(err.value).splitlines()
    assert lines[0].endswith("nothing ran:"), lines
    return lines[1:]


def one(override: dict, **kw) -> str:
    found = problems(override, **kw)
    assert len(found) == 1, found
    return found[0]
