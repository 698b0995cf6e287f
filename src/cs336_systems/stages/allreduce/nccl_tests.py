"""The all-reduce rows in nccl-tests' layout: `all_reduce_perf`'s out-of-place columns (size (B),
count (elements), type, redop, root, time (us), algbw and busbw (GB/s), #wrong), as a text file
beside the job's CSV (`<backend>.nccl-tests.txt`), header lines starting with '#' and columns
right-aligned as nccl-tests prints them, one table per (backend, buffers, world size), so the
numbers can be set beside an `all_reduce_perf` run's. time: the median of the timed calls;
algbw = size / time (GB = 1e9 B); busbw = algbw * 2 (n - 1) / n; #wrong: 0 where the sums
checked out, else the whole count (we check a point, not each element)."""

from __future__ import annotations

from pathlib import Path

# nccl-tests' widths: size, count, type, redop, root; then time, algbw, busbw, #wrong
HEADER = (
    "#       size         count      type   redop    root     time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)       ",
)
COLUMNS = ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")
FLOAT_BYTES = 4  # the stage's messages are float32 (measure.py: message_numel)


def path_beside(csv_path: str | Path) -> Path:
    return Path(csv_path).with_suffix(".nccl-tests.txt")


def line(row: dict) -> str:
    """One point's line, its bandwidths computed from its size and median time."""
    n, nbytes, ms = int(row["world_size"]), int(row["bytes"]), float(row["time_ms_median"])
    algbw = nbytes / (ms * 1e-3) / 1e9
    busbw = algbw * 2 * (n - 1) / n
    wrong = 0 if row["status"] == "ok" else nbytes // FLOAT_BYTES
    head = f"{nbytes:12d}  {nbytes // FLOAT_BYTES:12d}  {'float':>8s}  {'sum':>6s}  {-1:6d}"
    return f"{head}  {ms * 1e3:7.2f}  {algbw:6.2f}  {busbw:6.2f}  {wrong:5d}"


def table(rows: list[dict]) -> str:
    """The file's text: a table per (backend, buffers, world size) of the points that were timed;
    a point that was not (skipped, oom, error) is a '#' line with its status."""
    out = []
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        key = (r.get("backend"), r.get("buffers", "default"), int(r["world_size"]))
        groups.setdefault(key, []).append(r)
    for (backend, buffers, n), group in groups.items():
        out += [f"# all_reduce, {backend}, {buffers} buffers, {n} ranks: nccl-tests' out-of-place"
                " columns (time: the median)", "#", *HEADER]  # fmt: skip
        timed = [r for r in group if float(r.get("time_ms_median") or "nan") > 0]
        for r in group:
            out.append(line(r) if r in timed else f"# {int(r['bytes']):10d} B: {r['status']}")
        if timed:
            mean = sum(float(parse_line(line(r))["busbw"]) for r in timed) / len(timed)
            out += [f"# Out of bounds values : {sum(r['status'] != 'ok' for r in timed)}",
                    f"# Avg bus bandwidth    : {mean:.4g}", "#"]  # fmt: skip
    return "\n".join(out) + "\n"


def parse_line(text: str) -> dict:
    return dict(zip(COLUMNS, text.split(), strict=True))


def parse(text: str) -> list[dict]:
    """The data lines of an nccl-tests output (ours or all_reduce_perf's out-of-place part)."""
    return [parse_line(" ".join(t.split()[: len(COLUMNS)])) for t in text.splitlines()
            if t.strip() and not t.startswith("#")]  # fmt: skip
