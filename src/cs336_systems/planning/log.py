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

Lines go to stderr, flushed one by one, so the rules' ``2>&1 | tee {log}`` shows progress in
the job log while the job runs; every line of a multi-line message (a traceback, a subprocess's
output) carries the prefix, and Python warnings are logged in the same format (but those of
QUIET_WARNINGS, a library's that say nothing about our runs).
``CS336_LOG_LEVEL=DEBUG`` shows debug lines. Standard library only: the workflow may import
``core`` modules while planning without loading torch.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
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
        yield
    finally:
        _point.reset(token)


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
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        if record.stack_info:
            text = f"{text}\n{self.formatStack(record.stack_info)}"
        return "\n".join(head + line for line in (text.splitlines() or [""]))


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
    for message in QUIET_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


def status_level(status: str) -> int:
    """The level of a point's result line: WARNING for a failed point (`oom`, `error: ...`),
    INFO for one that ran or was skipped on purpose."""
    kind = str(status).split(":", 1)[0].strip()
    return logging.WARNING if kind in ("oom", "error") else logging.INFO
