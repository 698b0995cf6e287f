"""The benchmark stage's CSV from its points' CSVs: each row's MFU against the ceiling of the path
its matmuls take (mfu.py), then the sanity checks' flags.

    python -m cs336_systems.stages.benchmark.aggregate --ceilings C.csv --out B.csv points/*.csv
"""

from __future__ import annotations

import argparse

from cs336_systems.core.results import concat_csvs, read_csv, write_csv
from cs336_systems.planning.log import configure, get_logger
from cs336_systems.reporting.sanity import flag, is_suspect
from cs336_systems.stages.benchmark.mfu import add_mfu

log = get_logger(__name__)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ceilings", required=True, help="the ceilings stage's CSV")
    ap.add_argument("--out", required=True)
    ap.add_argument("inputs", nargs="+", help="the points' CSVs")
    args = ap.parse_args(argv)
    configure("benchmark")
    df = flag(add_mfu(concat_csvs(args.inputs), read_csv(args.ceilings)), "benchmark")
    write_csv(df, args.out)
    not_ok = int((df["status"] != "ok").sum()) if len(df) else 0
    log.info("wrote %s: %d rows, %d not ok, %d suspect", args.out, len(df), not_ok,
             int(is_suspect(df).sum()))  # fmt: skip


if __name__ == "__main__":
    main()
