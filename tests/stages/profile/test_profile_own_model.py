"""A model of one's own profiled as the course's sizes are (docs/own-model.md): its points and
kernels table, its attention its own (no annotated ranges), and the section rendered beside the
course's rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from test_profile import _args

from cs336_systems.planning import own_model as plan_own
from cs336_systems.stages.profile import measure as prof

NAME = "conv-lm"
OWN = {"name": NAME, "factory": "cs336_systems.models.examples:conv_lm"}


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("profile_own")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(plan_own.ENV, json.dumps(OWN))
        course = prof.run(_args(tmp / "course", modes=["forward"]))
        own = prof.run(_args(tmp / "own", size=NAME))
    return tmp, course, own


def test_the_own_model_is_profiled_with_its_kernels(own_run):
    _, _, (points, kernels) = own_run
    assert set(points["size"]) == {NAME} and set(points["status"]) == {"ok"}
    assert set(points["attention"]) == {prof.OWN_ATTENTION}
    assert set(points["flops_source"]) == {"counted"}
    assert set(kernels["size"]) == {NAME}
    assert (kernels["kernel_class"] == "gemm").any()  # its MLPs and head
    assert not kernels["phase"].str.startswith("attention.").any()


def test_the_section_renders_with_the_own_model(own_run, tmp_path):
    from cs336_systems.reporting.report import render
    from cs336_systems.stages.profile import analysis

    _, (cp, ck), (op, ok) = own_run
    pd.concat([cp, op]).to_csv(tmp_path / "profile.csv", index=False)
    pd.concat([ck, ok]).to_csv(tmp_path / "profile_kernels.csv", index=False)
    analysis.plot(tmp_path, tmp_path / "figures")
    s = analysis.context(tmp_path)
    assert s["available"]
    text = render(tmp_path, ["profile"])
    assert f"Own model **{NAME}**" in text and "FLOPs counted" in text
    assert "need the course's attention module" in text
