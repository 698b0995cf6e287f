"""python -m cs336_systems.analysis plot <stage> --results results/<machine> --figures DIR"""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("cmd", choices=["plot"])
    ap.add_argument("stage")
    ap.add_argument("--results", required=True, type=Path)
    ap.add_argument("--figures", required=True, type=Path)
    args = ap.parse_args(argv)
    module = importlib.import_module(f"cs336_systems.analysis.{args.stage}")
    args.figures.mkdir(parents=True, exist_ok=True)
    for path in module.plot(args.results, args.figures):
        print(f"[plots] wrote {path}", flush=True)


if __name__ == "__main__":
    main()
