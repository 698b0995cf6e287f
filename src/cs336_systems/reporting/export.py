r"""Write-up export: the report's tables as LaTeX and Typst files.

Every table a stage's analysis renders with `reporting.analysis.md_table` is recorded while the
report is computed (`recording()`), named after the context key that holds it
(`<stage>_<key>`, e.g. `benchmark_latency_table`), and written beside the report as
`tables/<name>.tex`, a `tabular` with booktabs' rules (`\usepackage{booktabs}`; `\input` it in
a `table` float), and `tables/<name>.typ`, a Typst `table` (`#include` it, or `#figure(include
"...")`). Cells are exactly as the report prints them; numeric columns are right-aligned as
there. The report's text uses Unicode (–, ×, ⚠): LuaLaTeX and XeLaTeX take it as is.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass
class Table:
    """A table as the report shows it: its cells as text and each column's alignment."""

    markdown: str
    cells: pd.DataFrame
    align: list[str]


_recorded: contextvars.ContextVar[list[Table] | None] = contextvars.ContextVar(
    "recorded_tables", default=None
)


@contextlib.contextmanager
def recording() -> Iterator[list[Table]]:
    """Collect every table `md_table` renders inside the block."""
    tables: list[Table] = []
    token = _recorded.set(tables)
    try:
        yield tables
    finally:
        _recorded.reset(token)


def record(markdown: str, cells: pd.DataFrame, align: list[str]) -> None:
    """Called by `md_table` with what it rendered (a no-op outside `recording()`)."""
    if (tables := _recorded.get()) is not None:
        tables.append(Table(markdown, cells.astype(str), align))


def _key_paths(value, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """(key path, text) of every string in a (nested) context."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _key_paths(v, (*path, str(k)))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _key_paths(v, (*path, str(i)))


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def name_tables(stage: str, context: dict, tables: list[Table]) -> dict[str, Table]:
    """{name: table}: each named `<stage>_<key path>` after the context value that holds it (a
    table inside a longer text: the text's key), else `<stage>_table<i>` in order."""
    texts = list(_key_paths(context))
    named: dict[str, Table] = {}
    for i, table in enumerate(tables, 1):
        exact = [p for p, t in texts if t == table.markdown]
        inside = [p for p, t in texts if table.markdown in t]
        path = (exact or inside or [None])[0]
        name = slug(f"{stage}_{'_'.join(path)}") if path else f"{stage}_table{i}"
        base, n = name, 2
        while name in named:
            name, n = f"{base}_{n}", n + 1
        named[name] = table
    return named


LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\$",
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
}


def _latex_cell(text: str) -> str:
    """A cell's text for LaTeX: its specials escaped, `code` spans as \\texttt."""
    out = "".join(LATEX_SPECIAL.get(c, c) for c in text)
    return re.sub(r"`([^`]*)`", r"\\texttt{\1}", out)


def latex(table: Table) -> str:
    """A booktabs `tabular` (\\toprule, \\midrule, \\bottomrule)."""
    spec = "".join("r" if a == "right" else "l" for a in table.align)
    rows = [" & ".join(_latex_cell(str(c)) for c in table.cells.columns) + r" \\", r"\midrule"]
    rows += [" & ".join(_latex_cell(v) for v in r) + r" \\" for r in table.cells.to_numpy()]
    return "\n".join([rf"\begin{{tabular}}{{{spec}}}", r"\toprule", *rows, r"\bottomrule",
                      r"\end{tabular}", ""])  # fmt: skip


def _typst_cell(text: str) -> str:
    """A cell as a Typst string literal (text, no markup to escape)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def typst(table: Table) -> str:
    """A Typst `table` with booktabs-like rules (needs Typst 0.11 or later)."""
    n = len(table.cells.columns)
    align = ", ".join("right" if a == "right" else "left" for a in table.align)
    head = ", ".join(_typst_cell(str(c)) for c in table.cells.columns)
    body = [",\n  ".join(_typst_cell(v) for v in r) + "," for r in table.cells.to_numpy()]
    return "\n".join(
        [
            "#table(",
            f"  columns: {n},",
            f"  align: ({align}{',' if n == 1 else ''}),",
            "  stroke: none,",
            "  table.hline(),",
            f"  table.header({head}),",
            "  table.hline(stroke: 0.5pt),",
            *(f"  {b}" for b in body),
            "  table.hline(),",
            ")",
            "",
        ]
    )


def write_tables(tables: dict[str, Table], folder: str | Path) -> list[Path]:
    """`<name>.tex` and `<name>.typ` of every table in `folder` (emptied of older ones)."""
    from cs336_systems.core.results import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.tex"), *folder.glob("*.typ")]:
        old.unlink()
    out = []
    for name, table in tables.items():
        for suffix, render in ((".tex", latex), (".typ", typst)):
            path = folder / f"{name}{suffix}"
            atomic_write_text(path, render(table))
            out.append(path)
    return out
