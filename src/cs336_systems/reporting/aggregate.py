"""A stage's CSV from its jobs' CSVs: the rows concatenated, each flagged where a sanity check
doubts its numbers (reporting/sanity.py; the CSV's name picks the checks the stages declare).

    python -m cs336_systems.reporting.aggregate --out results/M/allreduce.csv points/*.csv
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cs336_systems.core.results import concat_csvs, write_csv
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.reporting.sanity import flag

log = get_logger(__name__)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Concatenate a stage's per-job CSVs into its CSV")
    ap.add_argument("--out", required=True)
    ap.add_argument("inputs", nargs="+")
    args = ap.parse_args(argv)
    configure(Path(args.out).stem)  # the stage's CSV (results/<machine>/<stage>.csv) names it
    df = write_csv(flag(concat_csvs(args.inputs), Path(args.out).stem), args.out)
    log.info("wrote %s: %d rows from %d files", args.out, len(df), len(args.inputs))


if __name__ == "__main__":
    main()
