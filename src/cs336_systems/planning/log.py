"""The package's one log: stdlib `logging`, one format for every line, stage and point in each.

    2026-11-23 21:40:01 benchmark [small ctx512 naive | train_step bf16 compiled] INFO  12.31 ms
    2026-11-23 21:40:09 allreduce rank0 [default 64 MB] WARNING point failed with oom

Use:
- modules: ``log = get_logger(__name__)``, then ``log.info(...)`` (progress, results of a
  point), ``log.warning(...)`` (a failed point, a fallback taken), ``log.error(...)``;
- entry points (stage ``main()``, analysis ``plot_main``, ``report.main``, the results CLI) call
  ``configure(stage)`` once, first thing; distributed workers add their rank with ``set_rank``
  (``parallel.launch.init_worker`` does it);
- ``with point("small ctx512 naive"):`` stamps the point into every line logged inside it,
  also by lower layers (the harness's failure report); nested points join with `` | ``.

Lines go to stderr, flushed one by one, so the rules' ``2>&1 | {TEE} {log}`` shows progress in
the job log while the job runs; every line of a multi-line message (a traceback, a subprocess's
output) carries the prefix, and Python warnings are logged in the same format (but those of
QUIET_WARNINGS, a library's that say nothing about our runs).

A point's Python warnings are caught (``warnings.catch_warnings(record=True)``) and counted;
when the process ends each distinct one is logged once, with its count and the point that
first raised it, then one summary line. Under the workflow ($CS336_LOG_ONLY set) those lines
and tracebacks carry LOG_ONLY, so that planning/tee.py writes them to the job's log alone: the
console keeps the summary. `warning_lines` counts a Snakemake log's WARNING lines.
``CS336_LOG_LEVEL=DEBUG`` shows debug lines. Standard library only: the workflow may import
``core`` modules while planning without loading torch.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator

ROOT = "cs336_systems"
DATEFMT = "%Y-%m-%d %H:%M:%S"
LEVEL_ENV = "CS336_LOG_LEVEL"

# library warnings that say nothing about our runs (regexes on the message's start)
QUIET_WARNINGS = (
    # torch.profiler with a schedule of one cycle: we read every event of that cycle
    r"Warning: Profiler clears events at the end of each cycle",
)

# a line's first character where it goes to the job's log alone (planning/tee.py drops it),
# written under $CS336_LOG_ONLY (the workflow's shell prefix sets it)
LOG_ONLY = "\x1f"  # the unit separator: not a line break to str.splitlines
LOG_ONLY_ENV = "CS336_LOG_ONLY"

_point: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("point", default=())
_where = {"stage": "-", "rank": None}


def get_logger(name: str) -> logging.Logger:
    """The logger of module `name` (pass ``__name__``); it writes through the package's root."""
    if name != ROOT and not name.startswith(ROOT + "."):
        name = f"{ROOT}.{name.rsplit('.', 1)[-1]}"  # e.g. a module run as __main__
    return logging.getLogger(name)


@contextlib.contextmanager
def point(*parts: object) -> Iterator[None]:
    """Stamp the point (its parts joined by spaces) into every line logged inside the block."""
    token = _point.set((*_point.get(), " ".join(str(p) for p in parts if str(p))))
    try:
        with _caught_warnings():
            yield
    finally:
        _point.reset(token)


# (category, message, file, line) -> [count, the point that first raised it]
_warned: dict[tuple[str, str, str, int], list] = {}


def _quiet() -> None:
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


@contextlib.contextmanager
def _caught_warnings() -> Iterator[None]:
    """Every Python warning raised inside the block, counted in `_warned` (not shown now)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # an unclosed file the collector finds says where it was collected, not what the point
        # did: ignored, as Python's own filters ignore it
        warnings.simplefilter("ignore", ResourceWarning)
        _quiet()
        try:
            yield
        finally:
            where = current_point()
            for w in caught:
                key = (w.category.__name__, str(w.message), w.filename, w.lineno)
                _warned.setdefault(key, [0, where])[0] += 1


def report_warnings() -> None:
    """The points' warnings, each distinct one once with its count (to the job's log alone
    under the workflow), then one summary line (rank 0's, in a distributed job)."""
    if not _warned:
        return
    log = logging.getLogger(f"{ROOT}.warnings")
    points = {where for _, where in _warned.values()}
    total = sum(count for count, _ in _warned.values())
    for (category, message, file, line), (count, where) in _warned.items():
        at = f"{file}:{line}"
        extra = {"point": where, "log_only": True}
        log.warning("%dx %s: %s (%s)", count, category, message, at, extra=extra)
    if _where["rank"] in (None, 0):
        log.info(
            "%d Python warnings (%d distinct) in %d points, each listed once in the job's log",
            total,
            len(_warned),
            len(points),
            extra={"point": ""},
        )
    _warned.clear()


def warning_lines(text: str) -> tuple[int, int]:
    """(WARNING lines, lines) of a log's text, e.g. a run's Snakemake log."""
    lines = text.splitlines()
    return sum(1 for line in lines if re.search(r"\bWARNING\b", line)), len(lines)


def current_point() -> str:
    return " | ".join(p for p in _point.get() if p)


def set_rank(rank: int | None) -> None:
    """Show this process's rank in every line (distributed workers)."""
    _where["rank"] = rank


class _Stamp(logging.Filter):
    """Adds `stage`, `rank` and `point` to each record (unless the caller passed them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "stage"):
            record.stage = _where["stage"]
        if not hasattr(record, "rank"):
            record.rank = _where["rank"]
        if not hasattr(record, "point"):
            record.point = current_point()
        return True


class LineFormatter(logging.Formatter):
    """``<time> <stage>[ rank<r>] [<point>] <LEVEL> <message>``, the prefix on every line."""

    def format(self, record: logging.LogRecord) -> str:
        who = str(getattr(record, "stage", "-"))
        rank = getattr(record, "rank", None)
        if rank is not None:
            who += f" rank{rank}"
        pt = getattr(record, "point", "")
        if pt:
            who += f" [{pt}]"
        head = f"{self.formatTime(record, DATEFMT)} {who} {record.levelname:<5} "
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        # a traceback, or a message's `detail` (extra=): the lines after its first
        detail = "\n".join(t for t in (getattr(record, "detail", ""), record.exc_text) if t)
        if record.stack_info:
            detail = f"{detail}\n{self.formatStack(record.stack_info)}".lstrip("\n")
        mark = LOG_ONLY if os.environ.get(LOG_ONLY_ENV) else ""
        if getattr(record, "log_only", False):
            text, detail = f"{text}\n{detail}".rstrip("\n"), ""
            first = mark
        else:
            first = ""
        lines = [first + head + line for line in (text.splitlines() or [""])]
        # a traceback: to the job's log alone under the workflow (its first line stays)
        lines += [mark + head + line for line in detail.splitlines()]
        return "\n".join(lines)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of the line (test captures swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure(stage: str, rank: int | None = None, level: str | int | None = None) -> None:
    """Set up the package's log for an entry point: `stage` names it in every line.

    Safe to call again (a second entry point in the same process, tests): the handler is
    replaced, never doubled. `level` defaults to $CS336_LOG_LEVEL, else INFO.
    """
    _where["stage"] = stage
    _where["rank"] = rank
    handler = _StderrHandler()
    handler.setFormatter(LineFormatter())
    handler.addFilter(_Stamp())
    level = level or os.environ.get(LEVEL_ENV, "INFO")
    # the package's lines, and Python warnings (a library's UserWarning) in the same format
    for name in (ROOT, "py.warnings"):
        logger = logging.getLogger(name)
        for h in list(logger.handlers):
            if isinstance(h, _StderrHandler):
                logger.removeHandler(h)
        logger.addHandler(handler)
        # ours alone: a handler another library puts on the root must not repeat them
        logger.propagate = False
    logging.getLogger(ROOT).setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)
    _quiet()
    if not _where.get("reporting"):
        atexit.register(report_warnings)
        _where["reporting"] = True


def status_level(status: str) -> int:
    """The level of a point's result line: WARNING for a failed point (`oom`, `error: ...`),
    INFO for one that ran or was skipped on purpose."""
    kind = str(status).split(":", 1)[0].strip()
    return logging.WARNING if kind in ("oom", "error") else logging.INFO
