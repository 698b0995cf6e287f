"""The kernel_tests stage on its own: its workers, what pytest cannot collect or import, a
missing CSV (the stage's rows and report, with the attention and flash stages it gates, are in
tests/stages/attention/test_attention.py)."""

from __future__ import annotations

import os
import textwrap

import pandas as pd
from pipeline_utils import ROOT, kernel_tests_block

from cs336_systems.core import results as kernel_results
from cs336_systems.stages.kernel_tests import measure as kernel_tests_stage

COMMON = ["--machine", "test-machine", "--preset", "cpu"]


def test_kernel_tests_worker_count():
    cores = len(os.sched_getaffinity(0))
    assert kernel_tests_stage.worker_count("auto") == min(
        kernel_tests_stage.MAX_AUTO_WORKERS, cores
    )
    assert kernel_tests_stage.worker_count("3") == 3
    assert kernel_tests_stage.xdist_args(1) == []
    assert kernel_tests_stage.xdist_args(4) == ["-n", "4", "--dist", "worksteal"]


def test_kernel_tests_when_pytest_cannot_collect(tmp_path):
    bad = tmp_path / "test_bad.py"
    bad.write_text("import does_not_exist\n")
    out = tmp_path / "kt.csv"
    kernel_tests_stage.main(
        [*COMMON, "--files", str(bad), *kernel_tests_block(kernels={"flash_triton": "^test_"}),
         "--junit", str(tmp_path / "j.xml"), "--out", str(out)]
    )  # fmt: skip
    assert kernel_results.verdicts(out) == {"flash_triton": "failed"}


# installed in every Python process of the stage (sitecustomize): the Gluon dK/dV kernels' module
# raises on import, as it would under a Triton whose Gluon API moved
BROKEN_KERNEL = textwrap.dedent(
    """
    import importlib.abc
    import importlib.util
    import sys

    BROKEN = "cs336_systems.kernels.hopper.backward_dkdv"

    class Broken(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            return importlib.util.spec_from_loader(name, self) if name == BROKEN else None

        def create_module(self, spec):
            return None

        def exec_module(self, module):
            raise AttributeError("gluon has no attribute 'warpgroup_mma' (a broken kernel)")

    sys.meta_path.insert(0, Broken())
    """
)


def test_kernel_tests_fail_when_a_kernel_module_cannot_import(tmp_path, monkeypatch):
    """A kernel module that fails to import makes the kernel tests error (pytest cannot collect
    them) and the kernel's verdict `failed`: never skips, never a silent fallback."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BROKEN_KERNEL)
    monkeypatch.setenv("PYTHONPATH", f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = tmp_path / "kt.csv"
    kernel_tests_stage.main(
        [*COMMON, "--files", str(ROOT / "tests" / "unit" / "kernels" / "test_flash_attention.py"),
         *kernel_tests_block(kernels={"flash_triton": "^test_(triton_|hopper_|plan_)"},
                             select="adapters"),
         "--junit", str(tmp_path / "j.xml"), "--out", str(out)]
    )  # fmt: skip
    assert kernel_results.verdicts(out)["flash_triton"] == "failed"
    df = pd.read_csv(out)
    assert set(df["outcome"]) == {"error"}, df[["test", "outcome", "message"]]
    assert df["message"].str.contains("AttributeError").all(), df["message"].tolist()


def test_verdicts_of_missing_csv(tmp_path):
    assert kernel_results.verdicts(tmp_path / "absent.csv") == {}


def test_each_row_is_given_its_test_file():
    """JUnit names a case by its module (and class); the coverage table counts a code part's
    tests by file, so every row of a test file finds it, a pytest-run row none."""
    from cs336_systems.stages.kernel_tests.rows import outcomes_by_test, per_file

    files = "tests/unit/kernels/test_flash_attention.py,tests/unit/parallel/test_fsdp.py"
    df = pd.DataFrame(
        {
            "test": [
                "tests.unit.kernels.test_flash_attention::test_pytorch_forward[a]",
                "tests.unit.parallel.test_fsdp::test_tied_and_frozen[x]",
                "tests.unit.parallel.test_fsdp.TestUnits::test_one",
                "::<pytest run>",
            ],
            "name": [
                "test_pytorch_forward[a]",
                "test_tied_and_frozen[x]",
                "test_one",
                "<pytest run>",
            ],
            "outcome": ["passed", "failed", "skipped", "error"],
            "files": files,
        }
    )
    got = outcomes_by_test(df)
    assert list(got["file"]) == [
        "tests/unit/kernels/test_flash_attention.py",
        "tests/unit/parallel/test_fsdp.py",
        "tests/unit/parallel/test_fsdp.py",
    ]
    assert list(got["outcome"]) == ["passed", "failed", "skipped"]
    table = per_file(got)
    assert "| tests/unit/parallel/test_fsdp.py" in table and "failed" in table


def test_every_preset_runs_the_tests_of_each_code_part():
    """The code parts' tests are among the files of every preset: the report's coverage table
    gives each part its tests' result from the run."""
    import yaml

    from cs336_systems.reporting import questions

    blocks = yaml.safe_load((ROOT / "config/stages/kernel_tests.yaml").read_text())["kernel_tests"]
    wanted = {
        f for p in questions.PARTS if p["kind"] == "code" for f in questions.part_test_files(p)
    }
    for preset in ("cpu", "gpu", "full"):
        assert wanted <= set(blocks[preset]["files"]), preset
