"""Capture the small real fixtures the profile and memory tests read, on a GPU host.

    source scripts/gpu/env.sh          # NSYS, LD_LIBRARY_PATH with libdw (see its header)
    python3 scripts/gpu_capture_fixtures.py tests/fixtures/gpu

Writes into the folder (each file kept under ~1 MB):
- nsys_cuda_gpu_kern_sum.csv, nsys_nvtx_sum.csv, nsys_nvtx_gpu_proj_sum.csv: `nsys stats --format
  csv` of the profile stage's capture of the `small` model (context 128: forward, forward+backward
  and a training step, 1 warm-up + 1 measured step each);
- nsys_events.sqlite: the tables the stage reads from the SQLite export of the same capture of the
  `tiny` model (the export of `small` is too big for a fixture);
- memory_snapshot.pickle: the memory stage's CUDA memory snapshot of one `tiny` training step
  (context 64, fp32), stack frames trimmed per entry if needed to fit;
- capture.json: what was run, on what, and the file sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

LIMIT = 1_000_000


def run(cmd: list[str]) -> None:
    print("$", " ".join(cmd), flush=True)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    subprocess.run(cmd, check=True, env=env, cwd=ROOT)


def profile_capture(size: str, context: int, work: Path) -> Path:
    """Run the profile stage under nsys for one size; returns the .nsys-rep."""
    raw = work / size
    run(
        [
            sys.executable,
            "-m",
            "cs336_systems.stages.profile.measure",
            "run",
            "--machine=fixture",
            "--preset=gpu",
            f"--size={size}",
            f"--contexts={context}",
            "--modes=forward,forward_backward,train_step",
            "--warmup=1",
            "--steps=1",
            "--profiler=nsys",
            f"--raw-dir={raw}",
            "--keep-raw=true",
            f"--out={raw / 'points.csv'}",
            f"--kernels-out={raw / 'kernels.csv'}",
        ]
    )
    import pandas as pd

    points = pd.read_csv(raw / "points.csv")
    print(points[["point", "status", "profiler", "profiler_note"]].to_string(), flush=True)
    if set(points["profiler"]) != {"nsys"}:
        raise SystemExit(f"the {size} capture did not use nsys: {points['profiler_note'].tolist()}")
    return raw / f"{size}.nsys-rep"


def trim_frames(snapshot: dict, keep: int) -> dict:
    for trace in snapshot.get("device_traces", []):
        for entry in trace:
            entry["frames"] = entry.get("frames", [])[:keep]
    for seg in snapshot.get("segments", []):
        seg["frames"] = seg.get("frames", [])[:keep]
        for blk in seg.get("blocks", []):
            blk["frames"] = blk.get("frames", [])[:keep]
    return snapshot


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", type=Path, help="folder for the fixtures (e.g. tests/fixtures/gpu)")
    args = ap.parse_args(argv)

    import torch

    from cs336_systems.profiling import nsys as nsys_tools

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    nsys = nsys_tools.find_nsys(None)
    if nsys is None:
        raise SystemExit("no nsys: set NSYS (source scripts/gpu/env.sh)")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    meta: dict = {
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nsys": nsys_tools.version(nsys),
        "files": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # 1. stats CSVs of a small model
        rep = profile_capture("small", 128, work)
        stats = nsys_tools.stats_csv(nsys, rep, reports=("cuda_gpu_kern_sum", "nvtx_sum"))
        stats.update(nsys_tools.stats_csv(nsys, rep, reports=("nvtx_gpu_proj_sum",)))
        for report, path in stats.items():
            shutil.copy2(path, out / f"nsys_{report}.csv")
        # 2. the SQLite tables of a tiny model's capture
        rep = profile_capture("tiny", 64, work)
        db = rep.with_suffix(".sqlite")
        if not db.exists():
            db = nsys_tools.export_sqlite(nsys, rep)
        nsys_tools.trim_sqlite(db, out / "nsys_events.sqlite")
        # 3. a CUDA memory snapshot of a tiny training step
        mem = work / "memory"
        run(
            [
                sys.executable,
                "-m",
                "cs336_systems.stages.memory.measure",
                "run",
                "--machine=fixture",
                "--preset=gpu",
                "--size=tiny",
                "--contexts=64",
                "--modes=train_step",
                "--precisions=fp32",
                "--warmup=1",
                f"--raw-dir={mem / 'raw'}",
                f"--timeline-dir={mem / 'timelines'}",
                "--keep-raw=true",
                f"--out={mem / 'points.csv'}",
                f"--allocations-out={mem / 'allocations.csv'}",
            ]
        )
        snap_src = mem / "raw" / "tiny_64_train_step_fp32.pickle"
        with open(snap_src, "rb") as f:
            snapshot = pickle.load(f)
        keep = None
        data = pickle.dumps(snapshot)
        for k in (24, 16, 12, 8, 6, 4):
            if len(data) <= LIMIT:
                break
            keep = k
            data = pickle.dumps(trim_frames(snapshot, k))
        (out / "memory_snapshot.pickle").write_bytes(data)
        meta["memory_snapshot_frames_kept"] = keep or "all"
    for path in sorted(out.iterdir()):
        if path.name != "capture.json":
            meta["files"][path.name] = path.stat().st_size
    (out / "capture.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    too_big = {k: v for k, v in meta["files"].items() if v > LIMIT}
    if too_big:
        print(f"warning: over {LIMIT} bytes: {too_big}", file=sys.stderr)


if __name__ == "__main__":
    main()
