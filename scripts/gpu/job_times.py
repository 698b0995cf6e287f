"""The slowest finished jobs of a run, from Snakemake's per-job benchmark files
(results/<machine>/jobs/**/*.tsv, first column: seconds), for the GPU run scripts' logs.

    python3 scripts/gpu/job_times.py results/<machine>/jobs [N]
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(jobs: str, most: int = 10) -> None:
    rows = []
    for f in Path(jobs).rglob("*.tsv"):
        lines = f.read_text().splitlines()
        if len(lines) > 1:
            rows.append((float(lines[-1].split("\t")[0]), f.relative_to(jobs).with_suffix("")))
    rows.sort(reverse=True)
    print(f"{len(rows)} timed jobs, {sum(s for s, _ in rows):.0f} s in all; slowest:")
    for s, name in rows[:most]:
        print(f"  {s:7.1f} s  {name}")


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:3]))
