"""The pipeline on a real SLURM, through profiles/slurm.

A session fixture stands up a throw-away cluster on this machine (tests/slurm/local_slurm.sh:
munge, slurmctld, two slurmd "nodes" in multiple-slurmd mode with fake GPUs, slurmdbd where it
is installed) and stops it at the end. Snakemake runs with the profile as a user runs it, in
copies of the workflow, and the tests check that jobs really went through SLURM (job ids in the
logs, their state in squeue or sacct, their allocations), that the pipeline's report has the
same tables as a local run of the same config (the session's finished tiny run, conftest.py),
that SLURM's refusals and kills surface as failed jobs and a rerun resumes, and that the
all-reduce stage spans two nodes.

Skipped, with the reason, where SLURM is not installed (`tests/slurm/install.sh` installs it on
Debian as root) or cannot start; CS336_REQUIRE_SLURM=1 turns those skips into failures (CI).
CS336_KEEP_SLURM_DIR=1 keeps the cluster's directory (logs) after the run.
The long runs start together in the background (one fixture) and each test waits for its own:
most of a SLURM run is waiting for a status check, and on 2 cores the waits overlap.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml
from pipeline_utils import ROOT, SNAKEMAKE, TINY_RUN, copy_workflow, env_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FIXTURE = ROOT / "tests" / "slurm" / "local_slurm.sh"
PROFILE = ROOT / "profiles" / "slurm"
# Two nodes shaped like GPU nodes so that the profile's requests fit unchanged; their CPUs,
# memory and GPUs are declared, not real (SlurmdParameters=config_overrides, gres files that
# are copies of /dev/null). A partition time limit of 12 h, so that longer requests are refused.
CLUSTER = {
    "NODES": "2",
    "CPUS_PER_NODE": "64",
    "MEM_PER_NODE": "256000",
    "FAKE_GPUS": "8",
    "MAX_TIME": "720",
}
# Poll SLURM a second after a job finished instead of the profile's 15 s; nothing else changes.
FAST = ["--slurm-init-seconds-before-status-checks", "1"]
TINY = TINY_RUN  # the config of conftest.py's finished_tiny_run, the local run compared with
MACHINE = "tiny-test"
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (\S+?)\)\.")
RULE_HEADER = re.compile(r"^(local)?rule (\w+):$", re.M)
WAIT = 600  # seconds any one run may take before the test gives up on it


# ---- the cluster ---------------------------------------------------------------------------


def why_no_slurm() -> str | None:
    if not sys.platform.startswith("linux"):
        return "a local SLURM needs Linux"
    if os.geteuid() != 0:
        return "starting slurmd and munged needs root (CI runs as root)"
    tools = ["munged", "mungekey", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol"]
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return (
            f"SLURM is not installed ({', '.join(missing)} missing); "
            "`bash tests/slurm/install.sh` installs it on Debian/Ubuntu as root"
        )
    etc = Path("/etc/slurm/slurm.conf")
    if etc.exists() and not etc.is_symlink():
        return "a real SLURM is configured on this host (/etc/slurm/slurm.conf): not touching it"
    return None


def skip_or_fail(reason: str):
    if os.environ.get("CS336_REQUIRE_SLURM") == "1":
        pytest.fail(f"CS336_REQUIRE_SLURM=1 but {reason}")
    pytest.skip(reason)


@dataclass
class Cluster:
    dir: Path
    with_dbd: bool

    def state(self, jobid: str) -> str:
        """The job's state from sacct (with slurmdbd) or squeue (finished jobs stay listed)."""
        if self.with_dbd:
            cmd = ["sacct", "-X", "-n", "-P", "-j", jobid, "-o", "State"]
        else:
            cmd = ["squeue", "-h", "--states=all", "-j", jobid, "-o", "%T"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.split()
        return out[0] if out else ""

    def wait_state(self, jobid: str, states: set[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (state := self.state(jobid)) not in states and time.monotonic() < deadline:
            time.sleep(0.5)
        return state

    def job(self, jobid: str) -> dict[str, str]:
        """`scontrol show job` as a dict (finished jobs stay for MinJobAge, 10 min here)."""
        out = subprocess.run(
            ["scontrol", "show", "job", "-o", jobid], capture_output=True, text=True, timeout=30
        ).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def nodes_that_ran_steps_of(self, jobid: str) -> set[str]:
        """Nodes whose slurmd launched a task of one of the job's steps (srun)."""
        started = re.compile(rf"launch task StepId={jobid}\.\d+ ")
        return {
            log.name.split(".")[1]
            for log in (self.dir / "log").glob("slurmd.*.log")
            if started.search(log.read_text(errors="replace"))
        }


@pytest.fixture(scope="session")
def slurm():
    reason = why_no_slurm()
    if reason:
        skip_or_fail(reason)
    state_dir = Path(tempfile.mkdtemp(prefix="cs336-slurm-"))
    state_dir.chmod(0o755)  # MariaDB runs as mysql and must reach its directory
    # slurmdbd (so that sacct works) where it is installed; CS336_SLURM_DBD=0 leaves it out
    with_dbd = os.environ.get("CS336_SLURM_DBD", "1") != "0" and all(
        shutil.which(t) for t in ("slurmdbd", "mariadbd", "mariadb-install-db")
    )
    env = {
        **os.environ,
        **CLUSTER,
        "SLURM_FIXTURE_DIR": str(state_dir),
        "WITH_DBD": "1" if with_dbd else "0",
    }
    try:
        t0 = time.monotonic()
        proc = subprocess.run(
            ["bash", str(FIXTURE), "start"], env=env, capture_output=True, text=True, timeout=240
        )
        if proc.returncode != 0:
            skip_or_fail(f"the local SLURM did not start:\n{proc.stderr[-3000:]}")
        print(f"\n[slurm] cluster up in {time.monotonic() - t0:.1f} s (slurmdbd: {with_dbd})")
        yield Cluster(state_dir, with_dbd)
    finally:
        subprocess.run(["bash", str(FIXTURE), "stop"], env=env, capture_output=True, timeout=120)
        if os.environ.get("CS336_KEEP_SLURM_DIR") != "1":
            shutil.rmtree(state_dir, ignore_errors=True)


# ---- running Snakemake ---------------------------------------------------------------------


def snakemake_cmd(*args: str, profile: Path = PROFILE) -> list[str]:
    return [*SNAKEMAKE, "--profile", str(profile), *FAST, *args]


def job_env(workdir: Path) -> dict[str, str]:
    """The copy's environment (SLURM jobs inherit it, --export=ALL). The rules run the
    interpreter of the job's Snakemake (common.smk's PY, an absolute path the nodes share), so
    nothing of the environment needs to be on PATH."""
    return env_for(workdir)


class Background:
    """A Snakemake run started now; its output goes to <workdir>/snakemake.out."""

    def __init__(self, name: str, workdir: Path, cmd: list[str]):
        self.name, self.workdir = name, workdir
        self.out = workdir / "snakemake.out"
        self._file = open(self.out, "w")  # closed in wait() or kill()
        self.t0 = time.monotonic()
        self.elapsed: float | None = None
        self.proc = subprocess.Popen(
            cmd, cwd=workdir, env=job_env(workdir), stdout=self._file, stderr=subprocess.STDOUT
        )
        threading.Thread(target=self._clock, daemon=True).start()

    def _clock(self) -> None:
        self.proc.wait()
        self.elapsed = time.monotonic() - self.t0

    def log(self) -> str:
        return self.out.read_text(errors="replace")

    def wait(self, timeout: float = WAIT) -> tuple[int, str]:
        try:
            rc = self.proc.wait(timeout=max(1.0, timeout - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"{self.name}: no end after {timeout:.0f} s:\n{self.log()[-4000:]}")
        if not self._file.closed:
            self._file.close()
            while self.elapsed is None:
                time.sleep(0.05)
            print(f"\n[slurm] {self.name}: exit {rc} after {self.elapsed:.0f} s")
        return rc, self.log()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._file.close()


def run(workdir: Path, *args: str, timeout: float = 300) -> tuple[int, str]:
    return Background(" ".join(args) or "run", workdir, snakemake_cmd(*args)).wait(timeout)


def submissions(log: str) -> dict[str, str]:
    """{SLURM job id: rule} for every job Snakemake submitted, read from its log."""
    rule_of_job = {}
    for block in re.split(r"\n\[\w{3} \w{3} [^\]]*\]\n", log):
        header = RULE_HEADER.search(block)
        jobid = re.search(r"^\s+jobid: (\d+)$", block, re.M)
        if header and jobid:
            rule_of_job[jobid.group(1)] = header.group(2)
    return {slurm_id: rule_of_job[sm_id] for sm_id, slurm_id, _ in SUBMITTED.findall(log)}


def local_rules(log: str) -> set[str]:
    return {name for local, name in RULE_HEADER.findall(log) if local}


def snakefile(workdir: Path, text: str) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "Snakefile").write_text(text)
    return workdir


# Three rules named like pipeline rules, so that the profile's per-rule resources apply: two
# GPU jobs on the cluster, then a local rule on this host.
TOY = """
rule all:
    input: "c.txt"

rule ceilings:
    output: "a.txt"
    log: "logs/a.log"
    shell: "echo job=${{SLURM_JOB_ID:-none}} gpus=${{CUDA_VISIBLE_DEVICES:-none}} > {output}"

rule benchmark:
    input: "a.txt"
    output: "b.txt"
    log: "logs/b.log"
    shell: "cat {input} > {output}; echo job=${{SLURM_JOB_ID:-none}} gpus=${{CUDA_VISIBLE_DEVICES:-none}} >> {output}"

rule report:
    localrule: True
    input: "b.txt"
    output: "c.txt"
    log: "logs/c.log"
    shell: "cat {input} > {output}; echo job=${{SLURM_JOB_ID:-none}} >> {output}"
"""

# Two jobs SLURM kills: one cancelled (scancel), one past its 1-minute limit. They wait for a
# file `release`, so that a rerun can finish them. `first` (local, to start the kills early)
# is done before them and must stay done; so must `witness`, a cluster job that completes once
# the test saw the time limit strike (the file `killed`). Why it is there: the plugin checks
# on its jobs at growing intervals (+10 s each time, back to the start only when a job
# completed) and Snakemake exits only at the next check after the failures, so without a job
# completing beside the kill the run would end about a minute after it had failed.
KILLED = """
rule all:
    input: "cancelled.txt", "timed_out.txt", "witnessed.txt"

rule first:
    localrule: True
    output: "first.txt"
    log: "logs/first.log"
    shell: "echo ${{SLURM_JOB_ID:-none}} > {output}"

rule to_cancel:
    input: "first.txt"
    output: "cancelled.txt"
    log: "logs/to_cancel.log"
    shell: "while [ ! -e release ]; do sleep 1; done; echo $SLURM_JOB_ID > {output}"

rule too_slow:
    input: "first.txt"
    output: "timed_out.txt"
    log: "logs/too_slow.log"
    resources: runtime=1
    shell: "while [ ! -e release ]; do sleep 1; done; echo $SLURM_JOB_ID > {output}"

rule witness:
    input: "first.txt"
    output: "witnessed.txt"
    log: "logs/witness.log"
    shell: "while [ ! -e killed ]; do sleep 0.2; done; echo $SLURM_JOB_ID > {output}"
"""

# Requests beyond the partition's time limit (12 h) and beyond the nodes' GPUs (2 x 8), with
# the message SLURM refuses them with.
TOO_LARGE = {
    "runtime=1000": "Requested time limit is invalid",
    "gpu=17": "Requested node configuration is not available",
}

# The all-reduce stage over two nodes: gloo, world sizes 2 and 4 (1 and 2 processes per node).
MULTINODE = {
    "preset": "cpu",
    "machine": MACHINE,
    "stages": ["allreduce"],
    "allreduce": {
        "cpu": {
            "backends": ["gloo"],
            "world_sizes": [2, 4],
            "sizes_mb": {"gloo": [1]},
            "warmup": 1,
            "repeats": 3,
            "min_repeats": 1,
            "max_seconds_per_size": 0.5,
            "launcher": {"topology": "slurm", "nnodes": 2},
            "timeout_s": 180,
        }
    },
}


@dataclass
class Runs:
    toy: Background
    killed: Background
    cancelled: dict
    on_slurm: Background
    multinode: Background | None
    multinode_problem: str | None
    too_large: dict[str, Background]


@pytest.fixture(scope="module")
def runs(slurm, tmp_path_factory):
    """Every long run, started at once; each test waits for its own."""
    started: list[Background] = []

    def start(name, workdir, cmd):
        started.append(Background(name, workdir, cmd))
        return started[-1]

    try:
        # the killed chain first: its time limit takes a minute or two to strike
        killed_dir = snakefile(tmp_path_factory.mktemp("killed"), KILLED)
        killed = start("killed chain", killed_dir, snakemake_cmd())
        cancelled: dict = {}
        threading.Thread(
            target=cancel_when_running, args=(slurm, killed, cancelled), daemon=True
        ).start()

        # with slurmdbd, the toy chain checks job states with sacct, the rest with squeue
        toy_dir = snakefile(tmp_path_factory.mktemp("toy"), TOY)
        sacct = ["--slurm-status-command", "sacct"] if slurm.with_dbd else []
        toy = start("toy chain", toy_dir, snakemake_cmd(*sacct))

        remote = copy_workflow(tmp_path_factory.mktemp("on_slurm"))
        on_slurm = start("tiny pipeline on SLURM", remote, snakemake_cmd(*TINY))

        too_large = {
            resources: start(
                f"toy chain asking for {resources}",
                snakefile(tmp_path_factory.mktemp("too_large"), TOY),
                snakemake_cmd("--set-resources", f"ceilings:{resources}"),
            )
            for resources in TOO_LARGE
        }

        multinode, problem = start_multinode(start, tmp_path_factory.mktemp("multinode"))

        yield Runs(toy, killed, cancelled, on_slurm, multinode, problem, too_large)
    finally:
        for bg in started:
            bg.kill()
        kill_processes_mentioning([bg.workdir for bg in started])


def kill_processes_mentioning(paths: list[Path]) -> None:
    """SIGKILL every process whose command line names one of `paths`: the cancelled job's
    Snakemake runner outlives its scancel here (the local slurmd does not track it) and would
    wait for its files long after the tests."""
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if any(str(p) in cmd for p in paths):
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def cancel_when_running(slurm: Cluster, killed: Background, cancelled: dict) -> None:
    """scancel the killed chain's `to_cancel` job once SLURM runs it; once SLURM killed its
    `too_slow` job for its time limit, let the `witness` job complete (the file `killed`)."""
    try:
        deadline = time.monotonic() + WAIT
        jobs: dict[str, str] = {}
        while time.monotonic() < deadline and killed.proc.poll() is None and len(jobs) < 2:
            jobs = {
                rule: jobid
                for _, jobid, log in SUBMITTED.findall(killed.log())
                for rule in ("to_cancel", "too_slow")
                if f"/rule_{rule}/" in log
            }
            time.sleep(0.5)
        if "to_cancel" in jobs:
            jobid = jobs["to_cancel"]
            cancelled["state_before"] = slurm.wait_state(jobid, {"RUNNING"}, timeout=120)
            subprocess.run(["scancel", jobid], timeout=30, check=True)
            cancelled["jobid"] = jobid
        if "too_slow" in jobs:
            slurm.wait_state(jobs["too_slow"], {"TIMEOUT"}, timeout=deadline - time.monotonic())
    finally:
        (killed.workdir / "killed").touch()  # whatever happened: the witness never hangs


def start_multinode(start, workdir: Path) -> tuple[Background | None, str | None]:
    """The allreduce stage on two nodes, unless the workflow would not ask SLURM for them
    (then the job would hang on a nested srun: say so instead of starting it)."""
    work = copy_workflow(workdir)
    (work / "multinode.yaml").write_text(yaml.safe_dump(MULTINODE))
    # the target first: --configfile takes several values
    args = [f"results/{MACHINE}/allreduce.csv", "--configfile", "multinode.yaml"]
    plan = subprocess.run(
        snakemake_cmd("--dry-run", *args),
        cwd=work,
        env=job_env(work),
        capture_output=True,
        text=True,
        timeout=300,
    )
    resources = re.findall(r"^rule allreduce:\n(?:\s+.*\n)*?\s+resources: (.*)$", plan.stdout, re.M)
    if plan.returncode != 0 or not resources:
        return None, f"dry run failed:\n{(plan.stdout + plan.stderr)[-3000:]}"
    asked = dict(kv.split("=", 1) for kv in resources[0].split(", ") if "=" in kv)
    if not (asked.get("nodes") == "2" and asked.get("tasks") == "2" and "mpi" in asked):
        return None, (
            "launcher topology `slurm` with nnodes 2 must make the allreduce rule ask for "
            f"nodes=2, tasks=2 and mpi (see docs/slurm.md); it asks for {resources[0]}"
        )
    return start("allreduce on two nodes", work, snakemake_cmd(*args)), None


# ---- the profile itself --------------------------------------------------------------------


def test_profile_settings_survive_the_default_workflow_profile():
    """profiles/default is loaded as the workflow profile beside --profile and wins per key:
    it must not undo what the cluster needs."""
    from snakemake.cli import parse_args

    old = Path.cwd()
    os.chdir(ROOT)
    try:
        _, args = parse_args(["--profile", str(PROFILE), "report"])
    finally:
        os.chdir(old)
    assert args.executor == "slurm"
    assert args.jobs == 50 and args.local_cores == 2
    assert args.slurm_status_command == "squeue"
    assert args.latency_wait == 60, "profiles/default overrides latency-wait"
    assert args.set_resources["benchmark"]["gpu"].value == 1


def test_profile_covers_every_rule():
    """Every measuring rule has its resources in the profile; the others (aggregates, plots,
    the report) are local rules and need none."""
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    rules = set()
    local = set()
    for smk in [ROOT / "Snakefile", *(ROOT / "workflow" / "rules").glob("*.smk")]:
        text = smk.read_text()
        for names in re.findall(r"^localrules:\s*(.+)$", text, re.M):  # the directive form
            local |= {n.strip() for n in names.split(",") if n.strip()}
        for name, body in re.findall(r"^rule (\w+):\n((?:[ \t]+.*\n|\n)*)", text, re.M):
            (local if re.search(r"^\s+localrule: True", body, re.M) else rules).add(name)
    rules -= local | {"all"}
    assert rules, "no rules found"
    assert rules == set(profile["set-resources"]), (
        "neither `localrule: True` nor resources in profiles/slurm: "
        f"{sorted(rules - set(profile['set-resources']))}; "
        f"in the profile but not cluster rules: {sorted(set(profile['set-resources']) - rules)}"
    )
    summaries = {r for r in rules | local if r.endswith(("_aggregate", "_plots")) or r == "report"}
    assert summaries <= local, f"not local rules: {sorted(summaries - local)}"


def test_launcher_finds_the_rendezvous_host_without_the_node_list():
    """The SLURM plugin's job step keeps only SLURM_JOB_ID: the batch script's host (the
    allocation's first node) hosts the rendezvous; outside an allocation the launch is a
    failed point, not a crash."""
    import socket

    from cs336_systems.parallel import launch

    assert launch.slurm_first_node({"SLURM_JOB_ID": "7"}) == socket.gethostname()
    with pytest.raises(RuntimeError, match="inside a SLURM allocation"):
        launch.slurm_first_node({})
    old = os.environ.pop("SLURM_JOB_ID", None)
    try:
        result = launch.launch("m", [], launch.Topology(1, nnodes=2, mode="slurm"), timeout_s=5)
    finally:
        if old is not None:
            os.environ["SLURM_JOB_ID"] = old
    assert result.status.startswith("error: topology 'slurm' runs inside a SLURM allocation")


# ---- a toy chain ---------------------------------------------------------------------------


def test_toy_chain_runs_through_slurm(slurm, runs):
    rc, log = runs.toy.wait()
    assert rc == 0, log[-4000:]
    jobs = submissions(log)
    assert sorted(jobs.values()) == ["benchmark", "ceilings"]
    assert "report" in local_rules(log)
    lines = (runs.toy.workdir / "c.txt").read_text().splitlines()
    assert lines[-1] == "job=none"  # the local rule ran outside SLURM
    for line, rule in zip(lines, ["ceilings", "benchmark"], strict=False):
        jobid = re.search(r"job=(\d+)", line).group(1)
        assert jobs[jobid] == rule, line
        if "File=" in (slurm.dir / "gres.conf").read_text():  # fake GPU devices (mknod) exist
            assert re.search(r"gpus=\d+$", line), line  # SLURM handed out one GPU
        assert slurm.state(jobid) == "COMPLETED"
        job = slurm.job(jobid)  # what SLURM allocated: the profile's resources for the rule
        assert job["NumCPUs"] == "8" and job["MinMemoryNode"] == "32000M", job
        assert job["TresPerJob"] == "gres:gpu:1", job
        assert job["TimeLimit"] == {"ceilings": "00:20:00", "benchmark": "01:00:00"}[rule], job
        # the job's SLURM log is kept where the profile puts it
        assert (runs.toy.workdir / f".snakemake/slurm_logs/rule_{rule}/{jobid}.log").exists()


@pytest.mark.parametrize("resources", TOO_LARGE)
def test_too_large_request_is_refused_at_submission(runs, resources):
    rc, log = runs.too_large[resources].wait()
    assert rc != 0
    # SLURM's own words, at submission: nothing queued, nothing waits
    assert "SLURM sbatch failed" in log and TOO_LARGE[resources] in log, log[-3000:]
    assert not SUBMITTED.search(log)


# ---- the pipeline --------------------------------------------------------------------------


def markdown_tables(text: str) -> list[list[list[str]]]:
    tables, current = [], []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            current.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif current:
            tables.append(current)
            current = []
    return tables


NUMBER = re.compile(r"[-+−]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?")


def masked(cell: str) -> str:
    """A cell with its numbers replaced and its sanity marks dropped: measured values (and so
    which of them fail a sanity check) differ from run to run."""
    if cell and set(cell) <= set(":-"):  # a separator: its width follows the column's text
        return "---"
    cell = NUMBER.sub("#", cell.replace(" ⚠ suspect", ""))
    return re.sub(r" \(# suspect rows? left out\)", "", cell)


def without_suspects(report: str) -> str:
    """The report without its sections' "Suspect numbers" blocks (paragraph and table): which
    rows are suspect depends on the run's noise (e.g. a forward+backward slower than a step)."""
    block = r"\*\*Suspect numbers\.\*\*.*?\n\n(?:\|[^\n]*\n)+"
    return re.sub(block, "", report, flags=re.S)


@pytest.fixture(scope="module")
def pipeline(runs, finished_tiny_run):
    """(the run on SLURM, the same run made locally, the SLURM run's log)."""
    rc, log = runs.on_slurm.wait()
    assert rc == 0, log[-5000:]
    return runs.on_slurm.workdir, finished_tiny_run, log


def test_pipeline_jobs_went_through_slurm(slurm, pipeline):
    remote, _, log = pipeline
    jobs = submissions(log)
    # the measuring jobs ran on the cluster, each a completed SLURM job whose log is kept
    assert sorted(jobs.values()) == ["benchmark", "benchmark", "benchmark_warmup", "ceilings"]
    for jobid, rule in jobs.items():
        assert slurm.state(jobid) == "COMPLETED", (jobid, rule)
        assert slurm.job(jobid)["TresPerJob"] == "gres:gpu:1"
        assert list((remote / ".snakemake/slurm_logs" / f"rule_{rule}").rglob(f"{jobid}.log"))
    # aggregates, plots and the report ran on the submitting host
    assert local_rules(log) >= {"benchmark_aggregate", "benchmark_plots", "report"}


def test_pipeline_on_slurm_matches_local_run(pipeline):
    remote, local, _ = pipeline
    keys = ["size", "context_length", "attention", "mode", "precision", "compile", "status"]
    a = pd.read_csv(remote / "results" / MACHINE / "benchmark.csv")
    b = pd.read_csv(local / "results" / MACHINE / "benchmark.csv")
    assert list(a.columns) == list(b.columns)
    assert set(a["status"]) == {"ok"}
    pd.testing.assert_frame_equal(
        a[keys].sort_values(keys).reset_index(drop=True),
        b[keys].sort_values(keys).reset_index(drop=True),
    )

    raw_a = (remote / "report" / MACHINE / "report.md").read_text()
    raw_b = (local / "report" / MACHINE / "report.md").read_text()
    report_a, report_b = without_suspects(raw_a), without_suspects(raw_b)
    headings = re.compile(r"^#+ .*$", re.M)
    assert headings.findall(report_a) == headings.findall(report_b)
    tables_a, tables_b = markdown_tables(report_a), markdown_tables(report_b)
    assert len(tables_a) >= 4 and len(tables_b) >= 4
    # which timings fail a sanity check (and so which rows and columns a table keeps) follows the
    # runs' noise on a loaded CPU: the tables must match exactly only where neither run had any
    if "Suspect numbers" not in raw_a + raw_b:
        assert len(tables_a) == len(tables_b)
        for ta, tb in zip(tables_a, tables_b, strict=True):
            assert ta[0] == tb[0]  # the header, exactly
            masked_a = [[masked(c) for c in row] for row in ta]
            assert masked_a == [[masked(c) for c in row] for row in tb]
    figures = [
        sorted(p.name for p in (d / "report" / MACHINE / "figures").glob("*.png"))
        for d in (remote, local)
    ]
    assert figures[0] == figures[1] and figures[0]


# ---- two nodes -----------------------------------------------------------------------------


def test_allreduce_spans_two_nodes(slurm, runs):
    if runs.multinode is None:
        pytest.fail(runs.multinode_problem)
    rc, log = runs.multinode.wait()
    assert rc == 0, log[-5000:]
    ((jobid, rule),) = submissions(log).items()
    assert rule == "allreduce"
    job = slurm.job(jobid)
    assert job["NumNodes"] == "2" and job["JobState"] == "COMPLETED", job
    # srun started a torchrun on each node
    assert slurm.nodes_that_ran_steps_of(jobid) == {"c1", "c2"}
    df = pd.read_csv(runs.multinode.workdir / "results" / MACHINE / "allreduce.csv")
    assert sorted(df["world_size"]) == [2, 4] and set(df["nnodes"]) == {2}
    assert set(df["status"]) == {"ok"}, df[["world_size", "status"]]
    assert (df["busbw_gbps"] > 0).all()


# ---- jobs SLURM kills ----------------------------------------------------------------------


def test_killed_jobs_fail_the_run_and_a_rerun_resumes(slurm, runs):
    rc, log = runs.killed.wait()
    assert rc != 0, log[-3000:]
    jobs = {rule: jobid for jobid, rule in submissions(log).items()}
    assert runs.cancelled.get("jobid") == jobs["to_cancel"], log[-3000:]
    assert runs.cancelled["state_before"] == "RUNNING"
    assert "first" in local_rules(log)
    assert slurm.state(jobs["to_cancel"]) == "CANCELLED"
    assert slurm.state(jobs["too_slow"]) == "TIMEOUT"
    assert slurm.state(jobs["witness"]) == "COMPLETED"
    for rule, state in [("to_cancel", "CANCELLED"), ("too_slow", "TIMEOUT")]:
        assert re.search(rf"SLURM-job '{jobs[rule]}' failed, SLURM status is: '{state}", log), rule
        assert f"Error in rule {rule}:" in log
    assert "Exiting because a job execution failed" in log

    # the rerun runs what failed, not what was done: `first` (local) and `witness` (on SLURM)
    (runs.killed.workdir / "release").touch()
    rc, relog = run(runs.killed.workdir)
    assert rc == 0, relog[-3000:]
    assert sorted(submissions(relog).values()) == ["to_cancel", "too_slow"]
    assert "first" not in local_rules(relog)
    assert (runs.killed.workdir / "timed_out.txt").exists()
