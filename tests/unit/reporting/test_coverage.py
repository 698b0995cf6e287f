"""The report's opening: the coverage table of a partial run, each stage's provenance (on this
CPU, dirty-tree detection in a scratch git repository) and the run's wall time."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
from fixture_rows import benchmark_rows, ceilings_rows, prov, write_results

from cs336_systems.core.results import git_state, provenance
from cs336_systems.reporting import coverage, questions, report

# ------------------------------------------------------------------------------ coverage


# the handouts' own counts: the lettered parts of their problem boxes (a box without letters is
# one part), read from the course's PDFs (stanford-cs336/assignment2-systems: the spring2025
# branch's cs336_spring2025_assignment2_systems.pdf, 1.0.5; main's cs336_assignment2_systems.pdf,
# 26.1.1): 2025 has 21 problems, 43 parts (34 written, 9 code); 2026 27 problems, 58 parts (49
# written, 9 code)
HANDOUT = {"2025": (43, 34, 9), "2026": (58, 49, 9)}


@pytest.mark.parametrize("edition", ["2025", "2026"])
def test_the_handouts_count_of_parts(edition):
    parts, written, code = HANDOUT[edition]
    mine = questions.handout_parts(edition)
    assert len(mine) == parts and len({p["problem"] for p in mine}) == (
        21 if edition == "2025" else 27
    )
    assert sum(p["kind"] == "written" for p in mine) == written
    assert sum(p["kind"] == "code" for p in mine) == code
    own = questions.own_parts(edition)
    assert own and all(p["kind"] in ("ours", "optional") for p in own)
    # the 2025 FlashAttention leaderboard (section 1.3.3) has no problem box: optional
    assert ("flash_leaderboard" in {p["id"] for p in own}) == (edition == "2025")
    table = coverage.coverage_table(edition, report.declared_questions(), {}, coverage.Machine())
    counts = coverage.summary(table)
    assert (counts["parts"], counts["measured"], counts["code"]) == (parts, written, code)
    assert counts["own"] == len(own) == len(coverage.own_rows(table))


def test_every_part_of_each_edition_is_listed():
    """One row per part (the handout's and those beside them): 2025 43 + 2, 2026 58 + 3."""
    p25, p26 = coverage.edition_questions("2025"), coverage.edition_questions("2026")
    assert len(p25) == len(set(p25)) == 45 and len(p26) == len(set(p26)) == 61
    assert "communication_accounting.c" in p25 and "communication_accounting.c" not in p26
    assert "ddp_bucketed_benchmarking.b" in p25 and "ddp_bucketed_benchmarking.b" not in p26
    assert "memory_profiling.f" in p26 and "memory_profiling.f" not in p25
    assert {"nsys_profile." + x for x in "abcde"} <= set(p25) & set(p26)
    with pytest.raises(ValueError):
        coverage.edition_questions("2024")


def _by_part(table):
    t = table.copy()
    t["id"] = coverage.edition_questions("2026" if len(t) == 61 else "2025")
    return t.set_index("id")


def test_coverage_verdicts():
    declared = {
        "benchmark": {
            "benchmarking_script.b": {"evidence": ["a", "b"]},
            "ours.mfu": {"evidence": ["m"], "needs": "gpu"},
        },
        "ddp": {"naive_ddp_benchmarking": {"evidence": ["q23"], "needs": "gpus:2"}},
        "precision": {"mixed_precision_accumulation": {"evidence": ["t"]}},
    }
    contexts = {
        "benchmark": {"available": True, "a": "table", "b": "", "m": "best"},
        "ddp": {"available": True, "q23": "text"},
    }
    cpu = _by_part(coverage.coverage_table("2025", declared, contexts, coverage.Machine(0, "cpu")))
    row = cpu.loc["benchmarking_script.b"]
    assert row["status"] == "partly" and "`b`" in row["why"]
    # the part links the report's own appendix: it works wherever the report is read
    assert row["part"] == "[benchmarking_script (b)](#part-benchmarking-script)"
    assert row["answered in"].startswith("Q1 (") and "[benchmark](#benchmark)" in row["answered in"]
    assert cpu.loc["ours.mfu", "status"] == "partly" and "no GPU" in cpu.loc["ours.mfu", "why"]
    assert "on a CUDA GPU" in cpu.loc["ours.mfu", "what answers it"]
    acc = cpu.loc["mixed_precision_accumulation"]
    assert acc["status"] == "not" and "not in this run" in acc["why"]
    assert "stages=all" in acc["what answers it"]
    naive = cpu.loc["naive_ddp_benchmarking"]
    assert naive["status"] == "partly" and "2 GPUs" in naive["what answers it"]
    assert cpu.loc["benchmarking_script.c", "status"] == "not"
    assert cpu.loc["benchmarking_script.c", "answered in"] == "–"
    # an implementation is a `code` row naming its module; without the kernel_tests stage its
    # tests did not run here, and the row says which command runs them
    code = cpu.loc["naive_ddp"]
    assert code["status"] == "not run" and code["kind"] == "code"
    assert "kernel_tests stage is not in this run" in code["why"]
    assert (
        "parallel/ddp.py" in code["answered in"]
        and "tests/stages/ddp/test_ddp.py" in code["what answers it"]
    )
    # nothing measured where the question needs more GPUs than the machine has: the reason
    # says so first, then which data is missing
    one = _by_part(
        coverage.coverage_table(
            "2025", declared, {**contexts, "ddp": {"available": True}}, coverage.Machine(1, "h100")
        )
    ).loc["naive_ddp_benchmarking"]
    assert one["status"] == "not"
    assert one["why"] == "needs 2 GPUs (this machine has 1); stage `ddp` has no data for `q23`"
    assert "one host with 2 GPUs" in one["what answers it"]
    # ... unless its rows ran and were flagged: then the flag is the reason, not the machine
    for n, verb in ((2, "are"), (1, "is")):
        flagged = _by_part(
            coverage.coverage_table(
                "2025", declared, {**contexts, "ddp": {"available": True}},
                coverage.Machine(0, "cpu"), {"ddp": n},
            )
        ).loc["naive_ddp_benchmarking"]  # fmt: skip
        assert flagged["status"] == "not" and "needs 2 GPUs" not in flagged["why"]
        said = f"{n} of its measured rows ran but failed a sanity check and {verb} left out"
        assert said in flagged["why"]
    gpu = _by_part(coverage.coverage_table("2025", declared, contexts, coverage.Machine(2, "x2")))
    assert gpu.loc["ours.mfu", "status"] == "answered"
    assert gpu.loc["naive_ddp_benchmarking", "status"] == "answered"
    # a stage's own coverage note lowers its verdict and gives the reason
    contexts["ddp"]["coverage"] = {"naive_ddp_benchmarking": {"status": "partly", "why": "gloo"}}
    gpu = _by_part(coverage.coverage_table("2025", declared, contexts, coverage.Machine(2, "x2")))
    assert tuple(gpu.loc["naive_ddp_benchmarking", ["status", "why"]]) == ("partly", "gloo")


def test_the_counts_add_up_to_the_parts():
    declared = report.declared_questions()
    for edition in ("2025", "2026"):
        table = coverage.coverage_table(edition, declared, {}, coverage.Machine(0, "cpu"))
        counts = coverage.summary(table)
        assert (
            counts["parts"] + counts["own"]
            == len(table)
            == len(coverage.edition_questions(edition))
        )
        assert counts["parts"] == len(questions.handout_parts(edition))
        assert counts["answered"] + counts["partly"] + counts["not"] == counts["measured"]
        assert counts["measured"] + counts["code"] == counts["parts"]
        assert (
            counts["code_passed"] + counts["code_failed"] + counts["code_not_run"] == counts["code"]
        )
        assert counts["code"] == sum(p["kind"] == "code" for p in questions.edition_parts(edition))
        assert counts["own_answered"] + counts["own_partly"] + counts["own_not"] == counts["own"]


@pytest.fixture
def partial_run(tmp_path):
    """A CPU run of two stages only (ceilings, benchmark)."""
    return write_results(
        tmp_path / "results" / "fixture-cpu",
        benchmark=benchmark_rows(),
        ceilings=ceilings_rows(),
    )


def _rows(text: str) -> list[list[str]]:
    return [
        [c.strip() for c in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| [")
    ]


def test_report_opens_with_the_coverage_table_of_a_partial_run(partial_run):
    text = report.render(partial_run, ["ceilings", "benchmark"])
    head, sections = text.split('<a id="ceilings"></a>', 1)
    assert "## Coverage" in head and "## Provenance" in head
    cov = head.split("## Coverage")[1].split("## Provenance")[0]
    handout, own = cov.split("Beside the handout's problems")
    rows = _rows(handout)
    assert len(rows) == 58  # the 2026 handout's parts by default, one row each
    assert [r[0].split("](")[0].strip("[") for r in _rows(own)] == [
        "ours (saved_tensors)", "ours (mfu)", "ours (flash_leaderboard)"
    ]  # fmt: skip
    status = {r[0].split("](")[0].strip("["): r[3] for r in rows}
    assert status["benchmarking_script (b)"] == "partly"  # measured, but on a CPU
    assert status["mixed_precision_accumulation"] == "not"  # precision is not in this run
    assert status["memory_profiling (f)"] == "not"
    assert status["fsdp"] == "not run"  # the kernel_tests stage, which runs its tests, did not run
    assert "snakemake --cores 1 report" in head
    assert "Of the 58 parts of the 2026 handout's problems" in head
    assert "0 passed, 0 failed, 9 not run" in " ".join(head.split())
    # every part links an anchor of the report itself, none a file outside it
    targets = set(re.findall(r"\]\((#part-[\w-]+)\)", head))
    assert targets and all(f'<a id="{t[1:]}"></a>' in text for t in targets)
    assert "](../" not in text
    text_2025 = report.render(partial_run, ["ceilings", "benchmark"], edition="2025")
    head_2025 = text_2025.split('<a id="ceilings"></a>')[0]
    assert "memory_profiling (f)" not in head_2025 and "communication_accounting (d)" in head_2025
    assert "Of the 43 parts of the 2025 handout's problems" in head_2025


def _kernel_tests_context(outcomes: dict[str, str]) -> dict:
    """A kernel_tests context whose test rows are `outcomes` ({"file::name": outcome})."""
    rows = [
        {"file": t.split("::")[0], "name": t.split("::")[1], "outcome": o}
        for t, o in outcomes.items()
    ]
    return {"available": True, "tests": pd.DataFrame(rows)}


def test_a_code_part_shows_its_tests_result_in_this_run():
    flash = "tests/unit/kernels/test_flash_attention.py"
    ddp = "tests/stages/ddp/test_ddp.py"
    ctx = _kernel_tests_context(
        {
            f"{flash}::test_pytorch_forward[cpu-fp32-2x32x32x16-full]": "passed",
            f"{flash}::test_pytorch_forward[cpu-fp32-2x32x32x16-causal]": "passed",
            f"{flash}::test_pytorch_backward[cpu-fp32-2x32x32x16-full]": "failed",
            f"{flash}::test_triton_forward[cpu-fp32-2x32x32x16-causal]": "skipped",
            f"{ddp}::test_ddp_matches_single_process[naive-None]": "passed",
            f"{ddp}::test_ddp_matches_single_process[overlap-None]": "error",
        }
    )
    t = _by_part(coverage.coverage_table("2026", {}, {"kernel_tests": ctx}, coverage.Machine()))
    forward = t.loc["flash_forward.a"]  # its own tests only: the backward's failure is not its
    assert forward["status"] == "passed" and "2 passed, 0 failed" in forward["answered in"]
    assert "[Kernel tests](#kernel_tests)" in forward["answered in"] and forward["why"] == ""
    backward = t.loc["flash_backward"]
    assert backward["status"] == "failed" and "0 passed, 1 failed" in backward["answered in"]
    assert "1 of its tests failed" in backward["why"]
    # every test of the causal flag skipped here: not run, and said so
    causal = t.loc["flash_forward.c"]
    assert causal["status"] == "not run" and "1 skipped" in causal["answered in"]
    assert "skipped on this machine" in causal["why"]
    assert t.loc["naive_ddp", "status"] == "passed"
    assert t.loc["ddp_overlap_individual_parameters", "status"] == "failed"
    # a part none of whose tests the run selected
    fsdp = t.loc["fsdp"]
    assert fsdp["status"] == "not run" and "ran none of its tests" in fsdp["why"]
    assert "uv run pytest tests/unit/parallel/test_fsdp.py" in fsdp["what answers it"]
    counts = coverage.summary(
        coverage.coverage_table("2026", {}, {"kernel_tests": ctx}, coverage.Machine())
    )
    assert (counts["code_passed"], counts["code_failed"], counts["code_not_run"]) == (2, 2, 5)


def test_a_departed_protocol_or_another_model_answers_only_partly():
    declared = {
        "benchmark": {"benchmarking_script.b": {"evidence": ["a"]}},
        "memory": {"memory_profiling.b": {"evidence": ["p"]}, "memory_profiling.d": {"evidence": ["d"]}},
        "attention": {"pytorch_attention.a": {"evidence": ["t"]}},
    }  # fmt: skip
    contexts = {
        "benchmark": {"available": True, "a": "table"},
        "memory": {"available": True, "p": "table", "d": "20 MiB"},
        "attention": {"available": True, "t": "table"},
    }
    used = {"benchmark": {"warmup_steps": [1], "measure_steps": [3]},
            "attention": {"fwd_steps": [100], "bwd_steps": [100]}}  # fmt: skip
    facts = coverage.RunFacts(
        deviations=questions.protocol_deviations(used),
        sizes={"memory": ["small", "tiny"], "benchmark": ["xl"]},
    )
    gpu = coverage.Machine(1, "h100")
    t = _by_part(coverage.coverage_table("2026", declared, contexts, gpu, facts=facts))
    bench = t.loc["benchmarking_script.b"]
    assert bench["status"] == "partly"
    assert "1 warm-up step where the handout asks 5; 3 measured steps where" in bench["why"]
    assert t.loc["pytorch_attention.a", "status"] == "answered"  # its protocol kept
    mem = t.loc["memory_profiling.b"]
    assert (
        mem["status"] == "partly" and "measured small, tiny; the handout asks the xl" in mem["why"]
    )
    # memory (d) of the tiny model is partly answered; the arithmetic derives it for the xl
    assert t.loc["memory_profiling.d", "status"] == "partly"
    declared["arithmetic"] = {"memory_profiling.d": {"evidence": ["q16"]}}
    contexts["arithmetic"] = {"available": True, "q16": {"text": "20 MiB"}}
    facts.sizes["arithmetic"] = ["xl"]
    t = _by_part(coverage.coverage_table("2026", declared, contexts, gpu, facts=facts))
    assert t.loc["memory_profiling.d", "status"] == "answered"
    # the 2025 handout asks its memory questions of the 2.7B
    facts.sizes["memory"] = ["2.7B"]
    t25 = coverage.coverage_table("2025", declared, contexts, gpu, facts=facts)
    t25.index = coverage.edition_questions("2025")
    assert t25.loc["memory_profiling.b", "status"] == "answered"


def test_links_work_from_a_copied_report_folder(tmp_path):
    """A file inside the report's folder is linked relative to it; a raw capture under results/
    (not committed with a reference, absent from Snakemake's archive) is named as text with the
    command that writes it again."""
    env = report.environment(results_dir=Path("results/m"), report_dir=Path("report/m"))
    link = env.filters["link"]
    assert link("report/m/figures/a.png") == "[`report/m/figures/a.png`](figures/a.png)"
    raw = link("results/m/ddp/raw/trace.json")
    assert "](" not in raw and "`results/m/ddp/raw/trace.json`" in raw
    assert "--forcerun ddp" in raw
    folder = env.globals["raw_link"]("profile")
    assert "](" not in folder and "--forcerun profile" in folder


# ---------------------------------------------------------------------------- provenance


def test_provenance_on_this_cpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU case")
    row = provenance("fixture-cpu", "cpu")
    assert row["cuda"] == "none" and row["nccl"] == "none" and row["gpu_count"] == 0
    assert row["torch_cuda"] == (torch.version.cuda or "none")
    assert row["driver"] == "–" and row["gpu_power_limit_w"] == "–"
    assert row["cpu_cores"] >= 1 and row["cpu_model"]
    assert row["nsys"]  # a version or 'absent'
    header = report.provenance_row("benchmark", pd.DataFrame([row]).astype(str))
    if torch.version.cuda:
        assert header["CUDA"] == f"none (CPU run; torch built for CUDA {torch.version.cuda})"


def test_older_rows_on_a_cpu_do_not_claim_cuda():
    old = pd.DataFrame([{"machine": "cpu", "device_name": "AMD EPYC", "cuda": "13.0"}])
    assert report.cuda_text(old) == "none (CPU run; torch built for CUDA 13.0)"
    gpu = pd.DataFrame([{"machine": "h200-x2", "device_name": "NVIDIA H200", "cuda": "13.0"}])
    assert report.cuda_text(gpu) == "13.0" and report.gpu_count(gpu) == 2


def _git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def test_dirty_tree_detection(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    (repo / "a.py").write_text("x = 1\n")
    (repo / "b.py").write_text("y = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "one")
    commit, files = git_state(repo)
    assert not commit.endswith("-dirty") and files == [] and len(commit) == 12
    (repo / "b.py").write_text("y = 2\n")
    (repo / "notes.txt").write_text("untracked\n")
    commit, files = git_state(repo)
    assert commit.endswith("-dirty") and files == ["b.py"]
    rows = pd.DataFrame([{"git_commit": commit, "git_dirty_files": " ".join(files)}])
    assert "dirty tree; uncommitted changes in `b.py`" in report.commit_text(rows)
    assert git_state(tmp_path / "not-a-repo")[0] in ("unknown", os.environ.get("CS336_GIT_COMMIT"))


def test_run_wall_time_from_the_job_files(tmp_path):
    results = write_results(tmp_path / "r", ceilings=ceilings_rows())
    jobs = results / "jobs"
    jobs.mkdir()
    now = time.time()
    for name, seconds, end in (("a", 60.0, now - 600), ("b", 30.0, now)):
        tsv = jobs / f"{name}.tsv"
        tsv.write_text(f"s\th:m:s\n{seconds}\t0:00:00\n")
        os.utime(tsv, (end, end))
    wall = report.run_wall_time(results, pd.DataFrame())
    assert wall["minutes"] == pytest.approx(11.0, abs=0.01)  # 660 s from first start to last end
    assert "per-job benchmark files (2 timed jobs, 1.5 min of job time" in wall["source"]
    # 9.5 of the 11 minutes ran no job (a run resumed in a later session): busy 1.5 min
    assert wall["busy_minutes"] == pytest.approx(1.5, abs=0.01)
    assert "9.5 min with no job running" in wall["source"]
    # the header states the busy time once, beside the wall time, not again in the source
    assert "with a job running" not in wall["source"]
    stamps = pd.DataFrame({"timestamp": ["2026-01-01T00:00:00+00:00", "2026-01-01T00:51:00+00:00"]})
    wall = report.run_wall_time(tmp_path / "no-jobs", stamps)
    assert wall["minutes"] == pytest.approx(51.0) and "row timestamp" in wall["source"]


def test_busy_seconds_is_the_union_of_the_job_spans():
    assert report.busy_seconds([(0, 10), (5, 20), (30, 40)]) == 30  # overlap counted once
    assert report.busy_seconds([(0, 100), (10, 20)]) == 100  # one inside another
    assert report.busy_seconds([]) == 0


def test_header_has_one_provenance_row_per_stage(partial_run):
    h = report.header(partial_run, ["ceilings", "benchmark", "memory"])
    table = h["provenance_table"]
    assert "| ceilings " in table and "| benchmark " in table and "| memory " not in table
    assert "Fixture CPU (2 cores)" in table and h["kind"] == "CPU only"


def test_prov_fixture_has_every_provenance_column():
    from cs336_systems.core.results import PROVENANCE_COLUMNS

    assert list(prov()) == PROVENANCE_COLUMNS


def test_a_report_rendered_by_another_commit_says_so(monkeypatch):
    """The header names the rendering code's commit only where it is not the run's: a finished
    run's results rendered again by newer analysis code say which code rendered them."""
    monkeypatch.setattr(report, "git_state", lambda root: ("abc123def456", []))
    same = pd.DataFrame({"git_commit": ["abc123def4567890"]})
    assert report.renderer_text(same) == ""
    other = pd.DataFrame({"git_commit": ["0123456789ab"]})
    text = report.renderer_text(other)
    assert "by commit `abc123def456`" in text and "this run's results" in text
    monkeypatch.setattr(report, "git_state", lambda root: ("abc123def456-dirty", ["src/x.py"]))
    assert "changed: src/x.py" in report.renderer_text(other)


def test_the_header_says_how_to_tell_what_changed_and_which_stages_were_dirty():
    """The header points to reporting/staleness.py; a dirty run names the stages whose files held
    its uncommitted changes (a stage's files: its code's imports, config and template)."""
    clean = pd.DataFrame({"git_commit": ["abc123def456"], "git_dirty_files": [""]})
    text = report.since_text(clean, ["ceilings", "benchmark"])
    assert "python -m cs336_systems.reporting.staleness" in text and "uncommitted" not in text
    measure = "src/cs336_systems/stages/ceilings/measure.py"
    dirty = pd.DataFrame({"git_commit": ["abc-dirty"], "git_dirty_files": [f"{measure} README.md"]})
    assert report.since_text(dirty, ["ceilings", "benchmark"]).endswith("the files of ceilings")
    only_docs = pd.DataFrame({"git_commit": ["abc-dirty"], "git_dirty_files": ["README.md"]})
    assert "no stage's files" in report.since_text(only_docs, ["ceilings"])


def test_provenance_numbers_are_written_alike():
    """nvidia-smi's "700.00" and a float column's "700.0" are one power limit, not two."""
    frame = pd.DataFrame(
        {"gpu_power_limit_w": ["700.00", "700.0"], "gpu_sm_clock_max_mhz": ["1980"] * 2}
    )
    row = report.provenance_row("ceilings", frame)
    assert row["GPU power limit"] == "700 W" and row["GPU max SM clock"] == "1980 MHz"


def test_the_report_says_which_card_measured_a_stage(monkeypatch):
    """Each row records the card(s) its job measured on (`gpu_index`: what planning/claim.py claimed
    for it); a stage's provenance row lists them."""
    from cs336_systems.core import results

    monkeypatch.setenv("CS336_GPU_CLAIMED", "2")
    assert results.gpu_index() == "2"
    monkeypatch.delenv("CS336_GPU_CLAIMED")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,3")
    assert results.gpu_index() == "1,3"
    rows = pd.DataFrame(
        [{**prov(machine="h100-x4", device="NVIDIA H100", gpus=4), "gpu_index": i} for i in "013"]
    )
    assert report.provenance_row("benchmark", rows)["GPU index"] == "0, 1, 3"
    assert report.provenance_row("benchmark", pd.DataFrame([prov()]))["GPU index"] == "–"


def test_a_part_links_only_the_sections_this_report_has():
    """torch_compile (b) is declared by attention and benchmark: a run without the attention
    stage (the 2025 reference) links the benchmark section only; a part whose every stage was
    left out names them, unlinked."""
    declared = {
        "attention": {"torch_compile.b": {"evidence": ["x"]}},
        "benchmark": {"torch_compile.b": {"evidence": ["c"]}},
        "precision": {"mixed_precision_accumulation": {"evidence": ["t"]}},
    }
    contexts = {"benchmark": {"available": True, "c": "table"}}
    t = _by_part(coverage.coverage_table("2025", declared, contexts, coverage.Machine(1, "gpu")))
    # on a CPU both stages answer partly for the same reason: it is given once
    declared_gpu = {st: {p: {**spec, "needs": "gpu"} for p, spec in qs.items()}
                    for st, qs in declared.items()}  # fmt: skip
    cpu = _by_part(coverage.coverage_table("2025", declared_gpu, {**contexts, "attention": {
        "available": True, "x": "table"}}, coverage.Machine(0, "cpu")))  # fmt: skip
    why = cpu.loc["torch_compile.b", "why"]
    assert cpu.loc["torch_compile.b", "status"] == "partly"
    assert why.count("measured on this machine (no GPU)") == 1
    where = t.loc["torch_compile.b", "answered in"]
    assert "[benchmark](#benchmark)" in where and "attention" not in where
    acc = t.loc["mixed_precision_accumulation", "answered in"]
    assert "`precision` (not in this run)" in acc and "](#precision)" not in acc


def test_a_grid_with_missing_points_answers_only_partly():
    """flash_benchmarking (a) asks every power of two from 128 to 65,536, both dtypes; a run
    whose rows ran five of them (the others skipped) answers it partly and names the gaps; an
    out-of-memory row is an answer and counts."""
    declared = {"flash": {"flash_benchmarking.a": {"evidence": ["t"]}},
                "allreduce": {"distributed_communication_single_node": {"evidence": ["a"]}}}  # fmt: skip
    contexts = {
        "flash": {"available": True, "t": "table"},
        "allreduce": {"available": True, "a": "x"},
    }
    five = [128, 1024, 4096, 16384, 65536]
    facts = coverage.RunFacts(
        grids={
            "flash": {"d_head": [16, 32, 64, 128], "seq_len": five, "dtype": ["bf16", "fp32"]},
            "allreduce": {"backend": ["nccl"], "world_size": [2, 4], "size_mb": [1.0, 10.0, 100.0, 1024.0]},
        }
    )  # fmt: skip
    t = _by_part(
        coverage.coverage_table("2026", declared, contexts, coverage.Machine(8), facts=facts)
    )
    flash = t.loc["flash_benchmarking.a"]
    assert flash["status"] == "partly"
    assert "no row that ran at seq_len 256, 512, 2048, 8192, 32768" in flash["why"]
    comm = t.loc["distributed_communication_single_node"]
    assert comm["status"] == "partly" and "world_size 6" in comm["why"]
    # 2025 asks gloo beside NCCL
    t25 = coverage.coverage_table("2025", declared, contexts, coverage.Machine(8), facts=facts)
    t25.index = coverage.edition_questions("2025")
    assert "backend gloo" in t25.loc["distributed_communication_single_node", "why"]
    facts.grids["flash"]["seq_len"] = [2**k for k in range(7, 17)]
    t = _by_part(
        coverage.coverage_table("2026", declared, contexts, coverage.Machine(8), facts=facts)
    )
    assert t.loc["flash_benchmarking.a", "status"] == "answered"


def test_the_grid_of_a_stage_counts_the_rows_that_ran(tmp_path):
    pd.DataFrame(
        {
            "seq_len": [128, 256, 512],
            "d_head": [16, 16, 16],
            "status": ["ok", "oom", "skipped: n above this preset's cap"],
        }
    ).to_csv(tmp_path / "flash.csv", index=False)
    assert report.grid_ran(tmp_path, "flash") == {"d_head": [16], "seq_len": [128, 256]}
    assert report.grid_ran(tmp_path, "absent") == {}
