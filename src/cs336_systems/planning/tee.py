"""`python -m cs336_systems.planning.tee LOG`: a job's output to its log and to the console, as
`tee LOG` does, except the lines marked `log.LOG_ONLY` (a point's Python warnings, each once with
its count; tracebacks): those go to the log alone, unmarked. The rules pipe every job through it
(`2>&1 | {TEE} {log}`), so Snakemake's console shows a job's progress and results, and its log
holds the rest. Standard library only; each line is passed on as it comes."""

from __future__ import annotations

import sys

from cs336_systems.planning.log import LOG_ONLY

MARK = LOG_ONLY.encode()


def tee(source, log, console) -> int:
    """Copy `source`'s lines (bytes) to `log` and `console`, the marked ones to `log` alone;
    the number of lines kept from the console."""
    held = 0
    for line in iter(source.readline, b""):
        if line.startswith(MARK):
            log.write(line[len(MARK) :])
            held += 1
        else:
            log.write(line)
            console.write(line)
            console.flush()
        log.flush()
    return held


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit("usage: python -m cs336_systems.planning.tee LOG")
    with open(args[0], "wb") as log:
        tee(sys.stdin.buffer, log, sys.stdout.buffer)


if __name__ == "__main__":
    main()
