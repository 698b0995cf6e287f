"""This machine, without importing torch: its visible GPUs, their memory, the host's memory, and
the tag its results go under (`results/<machine>/`).

The workflow plans with these (importing torch costs seconds on every dry run); the stages,
which have torch loaded anyway, name the same tag through `core/results.py:machine_tag`, and
both go through `tag_for`, the one definition of the tag.

GPUs come from `nvidia-smi --query-gpu` (name, memory, UUID), else from the driver's
`/proc/driver/nvidia/gpus/*/information` (name, UUID; memory unknown), filtered the way CUDA
filters them: `CUDA_VISIBLE_DEVICES` empty or starting with `-1` hides every GPU; otherwise
its entries (indices, or UUIDs and their prefixes) name the visible ones, in that order, up to
the first entry that names none. Devices are numbered in PCI bus order here, as with
`CUDA_DEVICE_ORDER=PCI_BUS_ID`; CUDA's default order can list a faster model first, which only
matters on a machine mixing GPU models (the tag names the first GPU).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
# longest tag: a results/ folder name, readable in a path
MAX_TAG_LENGTH = 64
TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class Gpu:
    name: str
    uuid: str = ""
    memory_mib: float | None = None


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def tag_for(gpu_names: list[str]) -> str:
    """The machine tag: the first GPU's model (with a count if several), or `cpu`."""
    if not gpu_names:
        return "cpu"
    name = slug(gpu_names[0].replace("NVIDIA", ""))[: MAX_TAG_LENGTH - 4].strip("-") or "gpu"
    n = len(gpu_names)
    return f"{name}-x{n}" if n > 1 else name


def _from_nvidia_smi() -> list[Gpu] | None:
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,uuid",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    gpus = []
    for line in out.stdout.splitlines():
        parts = [p.strip() for p in line.rsplit(",", 2)]
        if len(parts) != 3 or not parts[0]:
            continue
        try:
            memory = float(parts[1])
        except ValueError:
            memory = None
        gpus.append(Gpu(parts[0], parts[2], memory))
    return gpus


def _from_proc(root: Path = PROC_GPUS) -> list[Gpu]:
    gpus = []
    try:
        folders = sorted(root.iterdir())
    except OSError:
        return []
    for folder in folders:
        try:
            text = (folder / "information").read_text()
        except OSError:
            continue
        fields = dict(
            (k.strip(), v.strip())
            for k, _, v in (line.partition(":") for line in text.splitlines())
        )
        if fields.get("Model"):
            gpus.append(Gpu(fields["Model"], fields.get("GPU UUID", "")))
    return gpus


def visible(gpus: list[Gpu], cuda_visible_devices: str | None) -> list[Gpu]:
    """The GPUs a CUDA program sees under `CUDA_VISIBLE_DEVICES` (None: unset, all)."""
    if cuda_visible_devices is None:
        return list(gpus)
    chosen: list[Gpu] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry.isdigit():
            match = gpus[int(entry)] if int(entry) < len(gpus) else None
        elif entry.startswith("MIG-") and gpus:
            match = Gpu(gpus[0].name, entry)  # a MIG instance: its parent's model (assumed)
        else:
            found = [g for g in gpus if entry and g.uuid.startswith(entry)]
            match = found[0] if len(found) == 1 else None
        if match is None or match in chosen:
            break
        chosen.append(match)
    return chosen


@cache
def _installed() -> tuple[Gpu, ...]:
    found = _from_nvidia_smi()
    return tuple(found if found is not None else _from_proc())


def installed_gpus() -> list[Gpu]:
    """Every GPU of this host, in nvidia-smi's order (its indices), whatever is visible."""
    return list(_installed())


def gpu_indices(gpus: list[Gpu]) -> list[int]:
    """nvidia-smi's indices of `gpus` (GPUs of this host, e.g. the visible ones)."""
    installed = installed_gpus()
    return [installed.index(g) for g in gpus if g in installed]


def visible_gpus() -> list[Gpu]:
    """The GPUs CUDA would show this process (no torch, no CUDA context)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and (not env.strip() or env.strip().startswith("-1")):
        return []  # hidden: spares the nvidia-smi call
    return visible(list(_installed()), env)


def machine_tag() -> str:
    return tag_for([g.name for g in visible_gpus()])


def host_memory_mib(field: str = "MemTotal") -> float | None:
    """The host's memory (`MemTotal`, or `MemAvailable`: what fits now) in MiB; None unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        pages = os.sysconf("SC_PHYS_PAGES" if field == "MemTotal" else "SC_AVPHYS_PAGES")
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (ValueError, OSError, AttributeError):
        return None


def check_tag(tag: str) -> str | None:
    """Why `tag` cannot name a results folder, or None."""
    if len(tag) > MAX_TAG_LENGTH:
        return f"at most {MAX_TAG_LENGTH} characters (it names a folder)"
    if not TAG_PATTERN.match(tag):
        return "a folder name: letters, digits, '.', '_' and '-', starting with a letter or digit"
    return None


# off: the workflow does not ask torch whether it can use the GPUs (planning/config.py)
GPU_CHECK_ENV = "CS336_GPU_CHECK"
# the oldest Linux driver branch each CUDA of torch's wheels needs (NVIDIA's CUDA release notes)
MIN_DRIVER = {"13.0": 580, "12.9": 575, "12.8": 570, "12.6": 560, "12.4": 550, "12.1": 530,
              "11.8": 520}  # fmt: skip


def driver_version() -> str:
    """The NVIDIA driver's version ('' where nvidia-smi cannot say)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = out.stdout.split() if out.returncode == 0 else []
    return lines[0] if lines else ""


TORCH_PROBE = (
    "import json, torch; print(json.dumps({'available': torch.cuda.is_available(), "
    "'cuda': torch.version.cuda, 'count': torch.cuda.device_count()}))"
)


def start_torch_cuda(python: str = sys.executable) -> Callable[[], dict]:
    """What the environment's torch makes of this machine's GPUs, asked in a process of its own
    (planning never imports torch) started now, so that planning goes on beside it (torch's
    import takes seconds): the returned function waits for the answer, {"available", "cuda"
    (the wheel's), "count"}, or {} where torch cannot be imported."""
    try:
        proc = subprocess.Popen(
            [python, "-c", TORCH_PROBE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    except OSError:  # no interpreter to ask: the answer is torch's absence
        return lambda: {}

    def answer() -> dict:
        try:
            out, _ = proc.communicate(timeout=300)
            return json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 else {}
        except (subprocess.SubprocessError, ValueError, IndexError):
            proc.kill()
            return {}

    return answer


def torch_cuda(python: str = sys.executable) -> dict:
    """start_torch_cuda's answer, waited for at once."""
    return start_torch_cuda(python)()


def unusable_gpu(found: dict, driver: str) -> str:
    """Why torch cannot use the GPUs nvidia-smi shows, and the fix ('' when it can)."""
    if found.get("available"):
        return ""
    cuda = found.get("cuda") or "none"
    need = MIN_DRIVER.get(cuda)
    have = int(driver.split(".")[0]) if driver[:1].isdigit() else None
    cause = (
        f"torch was built for CUDA {cuda}, which needs driver {need} or newer; this host's "
        f"is {driver or 'unknown'}"
        if need and (have is None or have < need)
        else f"torch (CUDA {cuda}) reports no usable GPU with driver {driver or 'unknown'}"
    )
    return (
        f"nvidia-smi shows GPUs but torch.cuda.is_available() is false: {cause}. Update the "
        "driver, or install torch's wheels for the CUDA your driver supports "
        "(docs/own-gpus.md, 'Drivers and CUDA'), or run --config preset=cpu"
    )
