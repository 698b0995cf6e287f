"""The workflow end to end on a tiny config, and the rerun promises: only stale jobs run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import zipfile
from collections import Counter
from pathlib import Path, PurePosixPath

import pandas as pd
import pytest
import yaml
from pipeline_utils import (
    SNAKEMAKE,
    TINY_RUN,
    copy_run,
    copy_workflow,
    env_for,
    planned_jobs,
    snakemake,
    timed_snakemake,
)

TINY = ["--configfile", "tests/data/tiny_config.yaml"]
STAGES = ["--config", "stages=[ceilings,benchmark]"]
assert [*TINY, *STAGES] == TINY_RUN
MACHINE = "tiny-test"


@pytest.fixture(scope="module")
def tiny_run(finished_tiny_run, tmp_path_factory):
    """A full run of the ceilings and benchmark stages on the tiny config in a copy of the
    workflow: the session's finished run (conftest.py), copied, as the tests here edit it."""
    return copy_run(finished_tiny_run, tmp_path_factory.mktemp("wf") / "run")


def edit(path: Path, line: str) -> str:
    """Append a line (a real edit: Snakemake skips reruns when only the mtime moved)."""
    before = path.read_text()
    path.write_text(before + line)
    later = time.time() + 2
    os.utime(path, (later, later))
    return before


def test_run_produces_report_and_tidy_csvs(tiny_run):
    results = tiny_run / "results" / MACHINE
    df = pd.read_csv(results / "benchmark.csv")
    assert len(df) == 2 * 3  # 2 contexts x 3 modes
    assert set(df["status"]) == {"ok"}
    for col in [
        "machine",
        "device_name",
        "torch",
        "triton",
        "cuda",
        "git_commit",
        "timestamp",
        "preset",
        "size",
        "context_length",
        "mode",
        "precision",
        "compile",
        "status",
        "step_ms_mean",
        "step_ms_std",
        "step_ms_median",
        "tokens_per_s",
        "tflops",
        "mfu",
    ]:
        assert col in df, col
    assert (df["step_ms_mean"] > 0).all() and (df["mfu"] > 0).all()
    assert set(df["preset"]) == {"cpu"} and set(df["machine"]) == {MACHINE}
    report = (tiny_run / "report" / MACHINE / "report.md").read_text()
    assert "## End-to-end benchmarks" in report and "## Machine ceilings" in report
    assert "backward (forward+backward minus forward) takes" in report
    for fig in ["latency", "bwd_fwd", "warmup", "speedups", "mfu"]:
        png = tiny_run / "report" / MACHINE / "figures" / f"benchmark_{fig}.png"
        assert png.stat().st_size > 1000
        assert png.with_suffix(".pdf").read_bytes().startswith(b"%PDF")  # for a write-up
    # every table of the report as LaTeX and Typst, and the report as one page
    tables = tiny_run / "report" / MACHINE / "tables"
    assert {"ceilings_table.tex", "ceilings_table.typ", "benchmark_mfu_table.tex"} <= {
        p.name for p in tables.iterdir()
    }
    assert (
        "<h2>End-to-end benchmarks</h2>"
        in (tiny_run / "report" / MACHINE / "report.html").read_text()
    )
    # every rule has a log
    assert (results / "logs" / "ceilings.log").exists()


@pytest.fixture(scope="module")
def report_zip(tiny_run, tmp_path_factory) -> Path:
    """`snakemake --report report.zip` after the tiny run (about 6 s, made once)."""
    archive = tmp_path_factory.mktemp("report") / "report.zip"
    snakemake(tiny_run, *TINY, *STAGES, "--report", str(archive))
    return archive


def _assigned(page: str, var: str):
    """The JSON Snakemake's report page assigns to `var` (`var results = {...}`)."""
    start = page.index(f"var {var} = {{") + len(f"var {var} = ")
    return json.JSONDecoder().raw_decode(page[start:])[0]


def test_snakemakes_report_holds_the_study(tiny_run, report_zip):
    """After a run, `snakemake --report report.zip` is a browsable archive of the study: the
    report as one page, every figure and stage table of the run (each table as its CSV and as a
    page that shows it), each with its caption from workflow/report/, in its stage's category,
    and the workflow's description."""
    with zipfile.ZipFile(report_zip) as z:
        names = z.namelist()
        page = z.read("report/report.html").decode()
    figures = {f"benchmark_{f}.png" for f in ("latency", "bwd_fwd", "warmup", "speedups", "mfu")}
    tables = {"ceilings", "benchmark", "benchmark_warmup"}
    items = {PurePosixPath(n).name for n in names if "/data/raw/" in n}
    shown = {f"{t}.{ext}" for t in tables for ext in ("csv", "html")}
    assert items == {"report.html", *figures, *shown}

    results = {Path(k).name: v for k, v in _assigned(page, "results").items()}
    captions = tiny_run / "workflow" / "report"
    for name, item in results.items():
        # a figure's caption file drops its stage prefix, a table's (CSV, page) is its name
        stem = name.removesuffix(".csv").removesuffix(".html")
        if name.endswith(".png"):
            stem = name.removesuffix(".png").removeprefix("benchmark_")
        stage = "ceilings" if stem == "ceilings" else "benchmark"
        rst = captions / ("report.rst" if name == "report.html" else f"{stage}/{stem}.rst")
        first = rst.read_text().split()[:3]
        assert re.sub(r"<[^>]+>", "", item["caption"]).split()[:3] == first, (name, item)
    categories = _assigned(page, "categories")
    assert sorted(categories) == [
        "00. The study: the whole report, one page",
        "02. Machine ceilings",
        "03. End-to-end benchmarks",
    ]
    assert set(categories["03. End-to-end benchmarks"]) == {"figures", "tables"}
    assert "How transformer training uses a GPU, measured and explained" in page


_SCHEME = re.compile(r"^(https?|mailto|data|javascript):")
_REF = re.compile(r"""(?:\b(?:href|src)\s*=\s*\\?["']|"data_uri":\s*")([^"'\\]*)""")


def _dead_links(names: list[str], z: zipfile.ZipFile) -> list[tuple[str, str]]:
    """(page, link) for every link of the archive's pages (their attributes, and the report
    viewer's items and captions) that resolves neither to a file of the archive nor to an
    anchor of its own page."""
    dead = []
    for name in (n for n in names if n.endswith(".html")):
        text = z.read(name).decode()
        anchors = set(re.findall(r"""\b(?:id|name)\s*=\s*\\?["']([^"'\\]+)""", text))
        for ref in _REF.findall(text):
            target, _, fragment = ref.partition("#")
            if _SCHEME.match(ref) or (not target and fragment in anchors | {""}):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(name), target))
            if not target or path not in names:
                dead.append((name, ref))
    return dead


def test_snakemakes_report_links_resolve_and_shows_its_tables(tiny_run, report_zip):
    """Inside the archive nothing links out of it (the report's page, the viewer's captions,
    the tables' pages), and each stage table is an HTML item, which the viewer shows in its
    page (a CSV it only downloads), holding every row of its CSV."""
    with zipfile.ZipFile(report_zip) as z:
        names = z.namelist()
        assert _dead_links(names, z) == []
        viewer = z.read("report/report.html").decode()
        items = {Path(k).name: v for k, v in _assigned(viewer, "results").items()}
        assert items["ceilings.html"]["mime_type"] == "text/html"
        assert items["ceilings.csv"]["mime_type"] == "text/csv"
        table = z.read(f"report/{items['ceilings.html']['data_uri']}").decode()
    csv = pd.read_csv(tiny_run / "results" / MACHINE / "ceilings.csv")
    assert table.count("<tr>") == len(csv) + 1
    assert len(re.findall(r"<th[ >]", table)) == len(csv.columns)


def test_second_run_does_nothing(tiny_run):
    assert planned_jobs(tiny_run, *TINY, *STAGES) == Counter()


def test_changing_one_sweep_value_reruns_only_affected_jobs(tiny_run, tmp_path):
    cfg = yaml.safe_load((tiny_run / "tests/data/tiny_config.yaml").read_text())
    cfg["benchmark"]["cpu"]["context_lengths"] = [16, 32, 24]
    changed = tmp_path / "changed.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(tiny_run, "--configfile", str(changed), *STAGES)
    assert jobs == Counter(
        {"benchmark": 1, "benchmark_aggregate": 1, "benchmark_plots": 1, "report": 1}
    )


def test_changing_steps_reruns_every_benchmark_job_but_not_ceilings(tiny_run, tmp_path):
    cfg = yaml.safe_load((tiny_run / "tests/data/tiny_config.yaml").read_text())
    cfg["benchmark"]["cpu"]["measure_steps"] = 4
    changed = tmp_path / "steps.yaml"
    changed.write_text(yaml.safe_dump(cfg))
    jobs = planned_jobs(tiny_run, "--configfile", str(changed), *STAGES)
    assert jobs == Counter(
        {"benchmark": 2, "benchmark_aggregate": 1, "benchmark_plots": 1, "report": 1}
    )


def edited_plan(work: Path, rel: str) -> Counter:
    """The jobs a real edit of the package file `rel` would rerun (the edit is undone after)."""
    module = work / rel
    before = edit(module, "\n# an edit\n")
    try:
        return planned_jobs(work, *TINY, *STAGES)
    finally:
        module.write_text(before)
        past = time.time() - 3600
        os.utime(module, (past, past))


BENCHMARK_RERUN = Counter(
    {
        "benchmark": 2,
        "benchmark_warmup": 1,
        "benchmark_aggregate": 1,
        "benchmark_warmup_aggregate": 1,
        "benchmark_plots": 1,
        "report": 1,
    }
)


def test_editing_stage_module_reruns_stage_and_downstream(tiny_run):
    jobs = edited_plan(tiny_run, "src/cs336_systems/stages/benchmark/measure.py")
    assert jobs == BENCHMARK_RERUN
    assert "ceilings" not in jobs


def test_editing_a_file_two_imports_deep_reruns_the_job(tiny_run):
    """stages/benchmark/__main__ imports measure, which imports core/workload: no rule names
    workload.py, the import graph does."""
    jobs = edited_plan(tiny_run, "src/cs336_systems/core/workload.py")
    assert jobs == BENCHMARK_RERUN
    # and a file nothing in these stages imports reruns nothing
    assert edited_plan(tiny_run, "src/cs336_systems/stages/allreduce/measure.py") == Counter()


def test_editing_report_template_reruns_only_the_report(tiny_run):
    edit(tiny_run / "report/templates/report.md.j2", "\n_An edited template._\n")
    assert planned_jobs(tiny_run, *TINY, *STAGES) == Counter({"report": 1})
    # and running it leaves nothing stale
    snakemake(tiny_run, *TINY, *STAGES)
    assert planned_jobs(tiny_run, *TINY, *STAGES) == Counter()


@pytest.fixture(scope="module")
def bare_copy(tmp_path_factory):
    return copy_workflow(tmp_path_factory.mktemp("bad"))


@pytest.mark.parametrize(
    "override,expected",
    [
        ({"benchmark": {"cpu": {"sizes": ["tiny", "huge"]}}}, "benchmark.cpu.sizes[1]: 'huge'"),
        ({"benchmark": {"cpu": {"measure_steps": 0}}}, "benchmark.cpu.measure_steps: 0 — "),
        ({"benchmark": {"cpu": {"warmup_steps": -2}}}, "benchmark.cpu.warmup_steps: -2 — "),
        ({"benchmark": {"cpu": {"context_lengths": "128"}}}, "context_lengths: '128' — a"),
        # was an InputFunctionException wrapping a schema error, raised while planning
        ({"benchmark": {"cpu": {"context_lengths": [16, 0]}}}, "context_lengths[1]: 0 — "),
        ({"benchmark": {"cpu": {"colour": "blue"}}}, "benchmark.cpu.colour: 'blue' — unknown"),
        ({"preset": "tpu"}, "config: preset: 'tpu' — one of auto, cpu, gpu"),
        ({"presett": "gpu"}, "config: presett: 'gpu' — unknown key"),
        ({"stages": ["benchmark", "nope"]}, "config: stages[1]: 'nope' — a stage"),
        ({"stages": ["benchmark", "benchmark"]}, "config: stages[1]: 'benchmark' — listed"),
        # each of these ran jobs before failing
        ({"machine": "m" * 300}, "config: machine: 'mmm"),
        ({"ddp": {"cpu": {"env": {"NCCL_DEBUG": "INFO,WARN"}}}}, "ddp.cpu.env.NCCL_DEBUG"),
        ({"kernel_tests": {"cpu": {"select": "not (fp16"}}}, "kernel_tests.cpu.select"),
        ({"benchmark": {"cpu": {"warmup_sweep": {"sizes": []}}}}, "warmup_sweep.sizes: []"),
        # the edition: unknown, and a size its model table lacks (10B is 2026's only)
        ({"edition": 2024}, "config: edition: 2024 — 2026 (the current course, the default) or"),
        (
            {"edition": 2025, "benchmark": {"cpu": {"sizes": ["tiny", "10B"]}}},
            "config: benchmark.cpu.sizes[1]: '10B' — a model size of the 2025 edition: one of",
        ),
    ],
)
def test_bad_config_stops_before_any_job(bare_copy, tmp_path, override, expected):
    cfg = yaml.safe_load((bare_copy / "tests/data/tiny_config.yaml").read_text())

    def merge(a, b):
        for k, v in b.items():
            if isinstance(v, dict) and isinstance(a.get(k), dict):
                merge(a[k], v)
            else:
                a[k] = v

    merge(cfg, override)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(cfg))
    proc = snakemake(bare_copy, "--dry-run", "--configfile", str(bad), check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert expected in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("config: ")]
    assert lines and all(" — " in line for line in lines), out[-3000:]
    for raw in ("ValidationError", "InputFunctionException", "Traceback"):
        assert raw not in out, out[-3000:]
    assert not (bare_copy / "results").exists()


def test_an_integer_written_2_0_reaches_the_job_as_2(tmp_path):
    work = copy_workflow(tmp_path / "wf")
    cfg = yaml.safe_load((work / "tests/data/tiny_config.yaml").read_text())
    cfg["benchmark"]["cpu"]["batch_size"] = 2.0
    path = tmp_path / "float.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = snakemake(work, "--dry-run", "-p", "--configfile", str(path))
    out = proc.stdout + proc.stderr
    assert "config: benchmark.cpu.batch_size: 2.0 — read as the integer 2" in out
    assert '"batch_size":2,' in out and '"batch_size":2.0' not in out  # in the job's --block


def test_nested_numbers_on_the_command_line_reach_the_job_as_numbers(bare_copy):
    """Snakemake hands a nested --config value over as text ('24'): read as the number the
    schema wants, said so on one line, and passed to the job as 24."""
    proc = snakemake(
        bare_copy, "--dry-run", "-p", *TINY, "--config", "stages=[ceilings,benchmark]",
        "benchmark={cpu: {context_lengths: [16, 24], warmup_sweep: {context_length: 16}}}",
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert (
        "config: benchmark.cpu.context_lengths[1]: '24' — text from the command line "
        "(--config), read as the integer 24" in out
    )
    assert "--context-length 24 " in out


PROBE = """
import json, os, sys

print("PROBE " + json.dumps({"cwd": os.getcwd(), "env": os.environ.get("CS336_PROBE"),
                             "path": sys.path, "argv0": sys.argv[0], "rundir": workflow.rundir}))

rule all:
    output: "probe.txt"
    shell: "echo $CS336_PROBE > {output}"
"""


def test_a_forked_snakemake_sees_what_a_fresh_one_does(tmp_path):
    """pipeline_utils.snakemake forks a process that imported Snakemake: the workflow and its
    jobs see the directory, environment, sys.path and argv that `python -m snakemake` gives."""
    seen = []
    for mode in ("forked", "fresh"):
        work = tmp_path / mode
        work.mkdir()
        (work / "Snakefile").write_text(PROBE)
        env = {**env_for(work), "CS336_PROBE": f"probe {mode}"}
        if mode == "forked":
            proc = snakemake(work, env=env)
        else:
            proc = subprocess.run(
                [*SNAKEMAKE, "--cores", "1"], cwd=work, env=env, capture_output=True, text=True
            )
        assert proc.returncode == 0, proc.stderr[-3000:]
        probe = json.loads(proc.stdout.split("PROBE ", 1)[1].splitlines()[0])
        assert probe["cwd"] == str(work) == probe["rundir"] == probe["path"][0]
        assert probe["path"][1] == str(work / "src")  # PYTHONPATH, as env_for sets it
        assert probe["env"] == f"probe {mode}"
        assert (work / "probe.txt").read_text() == f"probe {mode}\n"  # the job's environment
        seen.append(json.loads(json.dumps(probe).replace(str(work), "<work>")))
    assert seen[0] == {**seen[1], "env": "probe forked"}


def test_nothing_to_do_is_decided_in_seconds(tiny_run):
    """A rerun of the default target on a finished run: no torch import, each table checked
    once, no source parsed again (the import graph is cached): under 5 s on CI (2 cores)."""
    proc, wall, cpu = timed_snakemake(tiny_run, *TINY, *STAGES)
    assert "Nothing to be done" in proc.stdout + proc.stderr
    assert cpu < 5.0, f"a no-op rerun took {cpu:.1f} CPU s ({wall:.1f} s wall)"


def test_every_job_shares_one_compile_cache_under_results(tmp_path):
    """The rules' shell prefix gives each job the run's Inductor and Triton caches
    (results/<machine>/.cache/), and keeps `pipefail`, so a failing command piped through `tee`
    still fails its job. Probed by a job of the real workflow (an appended rule)."""
    work = copy_workflow(tmp_path / "wf")
    with (work / "Snakefile").open("a") as f:
        f.write(
            '\n\nrule env_probe:\n    output:\n        "probe/env.txt",\n'
            '    shell:\n        "env | grep _CACHE_DIR= | sort > {output}"\n'
            '\n\nrule fail_probe:\n    output:\n        "probe/fail.txt",\n'
            '    shell:\n        "false | tee {output}"\n'
        )
    snakemake(work, "probe/env.txt", *TINY, *STAGES)
    env = dict(line.split("=", 1) for line in (work / "probe/env.txt").read_text().split())
    cache = work.resolve() / "results" / MACHINE / ".cache"
    assert env == {
        "TORCHINDUCTOR_CACHE_DIR": f"{cache}/inductor",
        "TRITON_CACHE_DIR": f"{cache}/triton",
    }
    failed = snakemake(work, "probe/fail.txt", *TINY, *STAGES, check=False)
    assert failed.returncode != 0 and not (work / "probe/fail.txt").exists()


def test_a_copied_run_continues_without_rerunning_finished_jobs(tiny_run, tmp_path):
    """A run copied elsewhere and back (every file with a new mtime, sources newest, as a device
    call's tree arrives) has nothing to do while Snakemake's records (.snakemake/metadata, which
    scripts/gpu/reference_run.sh packs) come with it: they hold the inputs' checksums. Without
    them every job reruns."""
    copy = tmp_path / "copy"
    shutil.copytree(tiny_run, copy, copy_function=shutil.copy)  # contents, not times
    later = time.time() + 5
    for path in [*(copy / "src").rglob("*.py"), *(copy / "workflow").rglob("*")]:
        os.utime(path, (later, later))
    proc = snakemake(copy, "--dry-run", *TINY, *STAGES)
    assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-3000:]
    shutil.rmtree(copy / ".snakemake" / "metadata")
    assert planned_jobs(copy, *TINY, *STAGES)["benchmark"] > 0


def test_the_gpu_preset_without_a_gpu_is_refused_before_any_job(bare_copy):
    """`--config preset=gpu` on a machine without a GPU would run the GPU grid on the CPU for
    hours under this machine's results folder: refused before the first job, naming the preset
    and the missing GPU. A dry run still plans it (a user checks a GPU run on a laptop)."""
    cfg = ["--config", "preset=gpu", "machine=gpu-probe"]
    proc = snakemake(bare_copy, "report", *cfg, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (
        "config: preset: 'gpu' — the gpu preset measures on a GPU and this machine has none" in out
    )
    results = bare_copy / "results" / "gpu-probe"
    assert not any(results.glob("*.csv")) and not (results / "logs").exists(), out[-2000:]
    jobs = planned_jobs(bare_copy, "report", *cfg)
    assert jobs["benchmark"] > 0 and jobs["flash"] > 0
