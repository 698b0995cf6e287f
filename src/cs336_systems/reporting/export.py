r"""Write-up export: the report's tables as LaTeX and Typst files.

Every table a stage's analysis renders with `reporting.analysis.md_table` is recorded while the
report is computed (`recording()`), named after the context key that holds it
(`<stage>_<key>`, e.g. `benchmark_latency_table`), and written beside the report as
`tables/<name>.tex` and `tables/<name>.typ`, with `tables/preamble.tex` beside them.

LaTeX: `\input{tables/preamble}` once after `\documentclass` (pdfLaTeX, LuaLaTeX and XeLaTeX
alike), then `\input{tables/<name>}` where a table goes (e.g. in a `table` float). The preamble
loads booktabs, array and graphicx; defines a macro for each non-ASCII symbol the tables use
(`\suspect` for ⚠, `\pmsign` for ±, `\geqsign` for ≥, ...: LATEX_SYMBOLS; each
`\providecommand`ed, so one defined before it restyles it) and `\unicodechar{<hex>}` for any
other; and the `fittable` environment each table sits in, which scales a table wider than the
line down to it. Load hyperref for links; without it a link is its text. Each table is a
booktabs `tabular`: numeric columns right-aligned, an "x ± y" column split in two aligned on the
±, a long text column wrapped.

Typst: `#include "tables/<name>.typ"` (or `#figure(include "...")`), Typst 0.11 or later. Text
goes in as string literals, so nothing in it is read as markup (`*`, `_`, `#`, `$`, `@`, `<`,
`[`, `\`, backticks print as they are); Typst takes Unicode as is.

The cells are the report's with their Markdown read: a code span becomes `\texttt` / `raw`, a
link to an address (`https:`, `mailto:`) `\href` / `link`, and a link to an anchor of the
report or to a file beside it (neither is in a write-up's folder) its text alone.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
import urllib.parse
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


# ---- a cell's Markdown: code spans and links ----------------------------------------------------

MARKDOWN = re.compile(r"`([^`]+)`|\[([^\]]*)\]\(([^)\s]*)\)")
ADDRESS = re.compile(r"[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # https:, mailto:, ...


@dataclass(frozen=True)
class Piece:
    """A run of a cell: `text`, a `code` span, or a `link` (its label's Markdown kept) to `url`."""

    kind: str
    text: str
    url: str = ""


def pieces(cell: str) -> list[Piece]:
    """A cell's text, code spans and links. A link to an anchor of the report or a file beside it
    (neither is in a write-up's folder) is its label's pieces."""
    out: list[Piece] = []
    at = 0
    for m in MARKDOWN.finditer(cell):
        if m.start() > at:
            out.append(Piece("text", cell[at : m.start()]))
        code, label, url = m.groups()
        if code is not None:
            out.append(Piece("code", code))
        elif ADDRESS.match(url):
            out.append(Piece("link", label, url))
        else:
            out.extend(pieces(label))
        at = m.end()
    if at < len(cell):
        out.append(Piece("text", cell[at:]))
    merged: list[Piece] = []  # a flattened link's text joins the text around it
    for p in out:
        if merged and p.kind == merged[-1].kind == "text":
            merged[-1] = Piece("text", merged[-1].text + p.text)
        else:
            merged.append(p)
    return merged


# ---- which columns are numbers ------------------------------------------------------------------

_NUMBER = r"[-−+]?\d[\d,]*(?:\.\d+)?(?:[eE][-+−]?\d+)?"
# a number, with a unit of %, × or x, a "± spread", and the suspect marker ⚠ (reporting/analysis.py)
NUMERIC = re.compile(
    rf"[~≈<>≤≥]?\s?{_NUMBER}\s?(?:%|×|x)?(?:\s?±\s?{_NUMBER}\s?%?)?(?:\s?⚠(?: suspect)?)?"
)
PLACEHOLDERS = {"", "–", "—", "-", "nan", "n/a"}
PM = re.compile(r"\s*±\s*")
WRAP_AT = 40  # a text column with a longer cell wraps (LaTeX: a `p` column of WRAP_WIDTH)
WRAP_WIDTH = "15em"
HEADER_AT = 16  # characters: a longer header over a column that does not wrap takes lines
LONGEST_RUN = 28  # characters: a wrapped column's longest run without a break
BREAKS = re.compile(r"[\s_/:]+")


def numeric(cell: str) -> bool | None:
    """True: a number as the report writes one ('1,024', '20.95 ± 2.40', '1.9×', '12.5%',
    '3.1 ⚠'); None: empty or a placeholder ('–'); False: text."""
    text = cell.strip()
    if text in PLACEHOLDERS:
        return None
    return NUMERIC.fullmatch(text) is not None


def column_kinds(table: Table) -> list[str]:
    """Each column as the write-up sets it: `right` (numbers), `pm` (numbers "x ± y": two
    columns aligned on the ±), `wrap` (long text that breaks into lines) or `left`."""
    kinds = []
    for i, align in enumerate(table.align):
        cells = [str(v) for v in table.cells.iloc[:, i]]
        found = {numeric(c) for c in cells}
        numbers = False not in found and True in found
        if numbers and any(PM.search(c) for c in cells):
            kinds.append("pm")
        elif numbers or align == "right":
            kinds.append("right")
        else:
            kinds.append("wrap" if wraps([*cells, str(table.cells.columns[i])]) else "left")
    return kinds


def wraps(cells: list[str]) -> bool:
    """A text column to wrap: a cell longer than WRAP_AT, and no run without a break (a space, a
    _, a / or a :) too long for the wrapped width (a commit's hash)."""
    runs = [len(r) for c in cells for r in BREAKS.split(c)]
    return max(len(c) for c in cells) > WRAP_AT and max(runs) <= LONGEST_RUN


def split_pm(cell: str) -> tuple[str, str] | None:
    """('x', 'y') of a cell 'x ± y', else None."""
    parts = PM.split(cell.strip(), maxsplit=1)
    return (parts[0], parts[1]) if len(parts) == 2 and all(parts) else None


# ---- LaTeX --------------------------------------------------------------------------------------

LATEX_SPECIAL = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "$": r"\ensuremath{\$}",  # pdfLaTeX's roman \$ is a TS1 glyph: a font it may lack
    "#": r"\#",
    "_": r"\_",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "<": r"\textless{}",  # in OT1 fonts a bare < > | print as ¡ ¿ —
    ">": r"\textgreater{}",
    "|": r"\textbar{}",
    "`": r"\`{}",
}
# non-ASCII text that LaTeX writes in ASCII
LATEX_TEXT = {"–": "--", "—": "---", "\u00a0": "~", "\u2009": r"\,", "\u202f": r"\,",
              "“": "``", "”": "''", "‘": "`", "’": "'"}  # fmt: skip
_SUSPECT = (
    r"\mbox{\ooalign{$\triangle$\cr\hidewidth\raisebox{.3ex}{\tiny\bfseries !}\hidewidth\cr}}"
)
# every other non-ASCII symbol the report's tables use: its macro in tables/preamble.tex and the
# macro's definition, from math fonts every engine has (pdfLaTeX has no TS1 text fonts without
# extra packages; Latin Modern, LuaLaTeX's default, has no ⚠ or ≥)
LATEX_SYMBOLS = {
    "⚠": ("suspect", _SUSPECT),
    "±": ("pmsign", r"\ensuremath{\pm}"),
    "×": ("timessign", r"\ensuremath{\times}"),
    "−": ("minussign", r"\ensuremath{-}"),
    "≥": ("geqsign", r"\ensuremath{\geq}"),
    "≤": ("leqsign", r"\ensuremath{\leq}"),
    "≈": ("approxsign", r"\ensuremath{\approx}"),
    "≠": ("neqsign", r"\ensuremath{\neq}"),
    "·": ("cdotsign", r"\ensuremath{\cdot}"),
    "→": ("arrowsign", r"\ensuremath{\rightarrow}"),
    "∈": ("insign", r"\ensuremath{\in}"),
    "∗": ("astsign", r"\ensuremath{\ast}"),
    "∘": ("circsign", r"\ensuremath{\circ}"),
    "√": ("sqrtsign", r"\ensuremath{\surd}"),
    "′": ("primesign", r"\ensuremath{'}"),
    "°": ("degreesign", r"\ensuremath{^\circ}"),
    "µ": ("microsign", r"\ensuremath{\mu}"),
    "μ": ("microsign", r"\ensuremath{\mu}"),
    "α": ("alphasign", r"\ensuremath{\alpha}"),
    "²": ("suptwosign", r"\ensuremath{^{2}}"),
    "³": ("supthreesign", r"\ensuremath{^{3}}"),
    "⁰": ("supzerosign", r"\ensuremath{^{0}}"),
    "ᵀ": ("transposesign", r"\ensuremath{^{\mathsf{T}}}"),
    "…": ("dotssign", r"\ldots"),
}


def latex_text(text: str, breaks: bool = False) -> str:
    """Plain text for LaTeX: its specials escaped, `--` kept two hyphens, each non-ASCII symbol
    as its macro (`\\unicodechar{<hex>}` for one the preamble does not name); `breaks`: a line
    may break after a _, a / or a : (a wrapped column's kernel names and paths)."""
    out = []
    for i, c in enumerate(text):
        if breaks and c in "_/:":
            out.append(LATEX_SPECIAL.get(c, c) + r"\allowbreak{}")
        elif c in LATEX_SPECIAL:
            out.append(LATEX_SPECIAL[c])
        elif c == "-" and text[i + 1 : i + 2] in ("-", "–", "—"):
            out.append("-{}")  # no en dash ligature
        elif c.isascii():
            out.append(c)
        elif c in LATEX_TEXT:
            out.append(LATEX_TEXT[c])
        elif c in LATEX_SYMBOLS:
            out.append(f"\\{LATEX_SYMBOLS[c][0]}{{}}")
        else:
            out.append(f"\\unicodechar{{{ord(c):04X}}}")
    return "".join(out)


def latex_url(url: str) -> str:
    """An address for \\href: percent-encoded where LaTeX cannot read it as is (~, ^, braces, a
    backslash, spaces), and #, % and & escaped, as hyperref asks where an argument holds it."""
    encoded = urllib.parse.quote(url, safe="/:?=&;,.@!$'()*+-_%#").replace("~", "%7E")
    return encoded.replace("%", r"\%").replace("#", r"\#").replace("&", r"\&")


def latex_cell(cell: str, breaks: bool = False) -> str:
    """A cell for LaTeX: its text escaped (`latex_text`), code spans \\texttt, links \\href."""
    out = []
    for p in pieces(cell):
        if p.kind == "code":
            out.append(r"\texttt{" + latex_text(p.text, breaks) + "}")
        elif p.kind == "link":
            out.append(rf"\href{{{latex_url(p.url)}}}{{{latex_cell(p.text, breaks)}}}")
        else:
            out.append(latex_text(p.text, breaks))
    return "".join(out)


LATEX_COLUMN = {
    "left": "l",
    "right": "r",
    "pm": r"r@{\,\pmsign{}\,}l",
    "wrap": rf">{{\raggedright\arraybackslash}}p{{{WRAP_WIDTH}}}",
}


def _guarded(text: str) -> str:
    """A row's or line's first cell: `{}` before a [ or * it starts with (else the \\\\ or rule
    before it reads them as its optional argument or star)."""
    return "{}" + text if text.startswith(("[", "*")) else text


def header_lines(cell: str) -> list[str]:
    """A header's words in lines of at most HEADER_AT characters (a header with Markdown: one
    line)."""
    if "`" in cell or "](" in cell:
        return [cell]
    lines: list[str] = []
    for w in cell.split():
        if lines and len(lines[-1]) + 1 + len(w) <= HEADER_AT:
            lines[-1] += " " + w
        else:
            lines.append(w)
    return lines or [cell]


def latex_header(cell: str, kind: str) -> str:
    """A column's header; a long one over a column that does not wrap in lines (`header_lines`,
    a `tabular` in the cell), aligned as its column."""
    lines = header_lines(cell)
    if kind == "wrap" or len(lines) < 2:
        return latex_cell(cell, breaks=kind == "wrap")
    pos = {"right": "r", "pm": "c"}.get(kind, "l")
    body = r" \\ ".join(_guarded(latex_cell(line)) for line in lines)
    return rf"\begin{{tabular}}[b]{{@{{}}{pos}@{{}}}}{body}\end{{tabular}}"


def latex_row(cells: list[str], kinds: list[str], header: bool = False) -> str:
    """One row; an "x ± y" cell as two (a header or a cell without ± spans both)."""
    out = []
    for cell, kind in zip(cells, kinds, strict=True):
        pm = split_pm(cell) if kind == "pm" and not header else None
        text = latex_header(cell, kind) if header else latex_cell(cell, breaks=kind == "wrap")
        if pm:
            out.append(f"{latex_cell(pm[0])} & {latex_cell(pm[1])}")
        elif kind == "pm":
            out.append(rf"\multicolumn{{2}}{{c}}{{{text}}}")
        else:
            out.append(text)
    return " & ".join([_guarded(out[0]), *out[1:]]) + r" \\"


def latex(table: Table) -> str:
    """A booktabs `tabular` (\\toprule, \\midrule, \\bottomrule) in a `fittable` (scaled down
    to the line where wider): \\input tables/preamble.tex first (`latex_preamble`)."""
    kinds = column_kinds(table)
    spec = "".join(LATEX_COLUMN[k] for k in kinds)
    rows = [latex_row([str(c) for c in table.cells.columns], kinds, header=True), r"\midrule"]
    rows += [latex_row([str(v) for v in r], kinds) for r in table.cells.to_numpy()]
    return "\n".join([r"\begin{fittable}", rf"\begin{{tabular}}{{{spec}}}", r"\toprule", *rows,
                      r"\bottomrule", r"\end{tabular}", r"\end{fittable}", ""])  # fmt: skip


LATEX_PREAMBLE = r"""% The tables' preamble: \input{tables/preamble} after \documentclass (pdfLaTeX, LuaLaTeX,
% XeLaTeX). Each macro is \providecommand'ed: define one before this to restyle it. Load
% hyperref (last, as usual) for \href's links; without it a link is its text.
\RequirePackage{booktabs}
\RequirePackage{array}
\RequirePackage{graphicx}
<macros>
% a character no macro above names: the glyph under LuaLaTeX and XeLaTeX, its code under pdfLaTeX
\providecommand\unicodechar[1]{\ifdefined\Umathcode\symbol{"#1}\else\textsf{[U+#1]}\fi}
\AtBeginDocument{\providecommand\href[2]{#2}}
% every table: as set, or scaled down to the line where wider
\ifdefined\fittablebox\else
  \newsavebox\fittablebox
  \newenvironment{fittable}{\begin{lrbox}{\fittablebox}}{\end{lrbox}%
    \ifdim\wd\fittablebox>\linewidth\resizebox{\linewidth}{!}{\usebox{\fittablebox}}%
    \else\usebox{\fittablebox}\fi\ignorespacesafterend}
\fi
"""


def latex_preamble() -> str:
    """tables/preamble.tex: the packages the tables use, a macro per symbol (LATEX_SYMBOLS)."""
    macros = {name: body for name, body in LATEX_SYMBOLS.values()}
    lines = [f"\\providecommand\\{name}{{{body}}}" for name, body in macros.items()]
    return LATEX_PREAMBLE.replace("<macros>", "\n".join(lines))


# ---- Typst --------------------------------------------------------------------------------------


def typst_str(text: str) -> str:
    """A Typst string literal: nothing in it is read as markup."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\n", "\\n").replace("\r", "\\r") + '"'


def _typst_parts(cell: str) -> list[str]:
    out = []
    for p in pieces(cell):
        if p.kind == "code":
            out.append(f"#raw({typst_str(p.text)})")
        elif p.kind == "link":
            out.append(f"#link({typst_str(p.url)})[{''.join(_typst_parts(p.text))}]")
        else:
            out.append(f"#{typst_str(p.text)}")
    return out


def typst_cell(cell: str) -> str:
    """A cell for Typst: a string literal, or content of string literals, `raw` code spans and
    `link`s where the cell has them."""
    ps = pieces(cell)
    if all(p.kind == "text" for p in ps):
        return typst_str("".join(p.text for p in ps))
    return "[" + "".join(_typst_parts(cell)) + "]"


def typst_row(cells: list[str], kinds: list[str], header: bool = False) -> str:
    """One row's cells; an "x ± y" cell as two, "x" and "± y" (a header or a cell without ±
    spans both)."""
    out = []
    for cell, kind in zip(cells, kinds, strict=True):
        pm = split_pm(cell) if kind == "pm" and not header else None
        if pm:
            out += [typst_cell(pm[0]), typst_cell(f"± {pm[1]}")]
        elif kind == "pm":
            out.append(f"table.cell(colspan: 2, align: center, {typst_cell(cell)})")
        else:
            out.append(typst_cell(cell))
    return ", ".join(out)


def _typst_layout(kinds: list[str]) -> list[str]:
    """The table's `columns` and `align` lines, and where it splits "x ± y" its `inset` (the two
    halves close together)."""
    cols: list[tuple[str, str]] = []  # each Typst column: its alignment, its half of "x ± y"
    for k in kinds:
        cols += (
            [("right", "x"), ("left", "y")]
            if k == "pm"
            else [("right" if k == "right" else "left", "")]
        )
    align = ", ".join(a for a, _ in cols)
    lines = [f"  columns: {len(cols)},", f"  align: ({align}{',' if len(cols) == 1 else ''}),"]
    xs = ", ".join(str(i) for i, (_, half) in enumerate(cols) if half == "x")
    ys = ", ".join(str(i) for i, (_, half) in enumerate(cols) if half == "y")
    if xs:
        lines.append(
            f"  inset: (x, y) => (left: if x in ({ys},) {{1.5pt}} else {{5pt}}, "
            f"right: if x in ({xs},) {{1.5pt}} else {{5pt}}, y: 5pt),"
        )
    return lines


def typst(table: Table) -> str:
    """A Typst `table` with booktabs-like rules (needs Typst 0.11 or later)."""
    kinds = column_kinds(table)
    head = typst_row([str(c) for c in table.cells.columns], kinds, header=True)
    body = [typst_row([str(v) for v in r], kinds) + "," for r in table.cells.to_numpy()]
    return "\n".join(
        [
            "#table(",
            *_typst_layout(kinds),
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
    """`<name>.tex` and `<name>.typ` of every table in `folder` (emptied of older ones), and the
    LaTeX tables' `preamble.tex`."""
    from cs336_systems.core.results import atomic_write_text

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for old in [*folder.glob("*.tex"), *folder.glob("*.typ")]:
        old.unlink()
    out = [folder / "preamble.tex"]
    atomic_write_text(out[0], latex_preamble())
    for name, table in tables.items():
        for suffix, render in ((".tex", latex), (".typ", typst)):
            path = folder / f"{name}{suffix}"
            atomic_write_text(path, render(table))
            out.append(path)
    return out
