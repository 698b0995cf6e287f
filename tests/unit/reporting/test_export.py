"""The write-up export: every report table as LaTeX (booktabs) and Typst under
report/<machine>/tables/, every figure also as PDF, the report as one HTML page, raw captures
as links (reporting/export.py, reporting/markdown.py, reporting/report.py)."""

from __future__ import annotations

import re

import pandas as pd
from fixture_rows import benchmark_rows, ceilings_rows, write_results
from writeup_checks import compile_latex, compile_typst, latex_or_skip

from cs336_systems.reporting import export, report
from cs336_systems.reporting.analysis import md_table
from cs336_systems.reporting.markdown import to_html


def test_tables_are_recorded_and_named_after_their_context_key():
    df = pd.DataFrame({"size": ["tiny", "small"], "ms": [1.5, 30.25]})
    with export.recording() as tables:
        ctx = {"latency": {"table": md_table(df)}, "note": "see " + md_table(df.head(1))}
    outside = md_table(df)
    named = export.name_tables("benchmark", ctx, tables)
    assert list(named) == ["benchmark_latency_table", "benchmark_note"]
    assert named["benchmark_latency_table"].align == ["left", "right"]
    assert named["benchmark_latency_table"].cells.values.tolist() == [
        ["tiny", "1.50"],
        ["small", "30.25"],
    ]
    assert outside and len(tables) == 2  # recorded only inside the block


def test_latex_is_booktabs_with_specials_escaped_and_typst_strings():
    cells = pd.DataFrame({"kernel_name": ["a & b", "50% of $x_1 #2"], "ms": ["1.0", "`2`"]})
    table = export.Table("", cells, ["left", "right"])
    tex = export.latex(table)
    assert tex.splitlines()[:4] == [
        r"\begin{fittable}",
        r"\begin{tabular}{lr}",
        r"\toprule",
        r"kernel\_name & ms \\",
    ]
    assert r"a \& b & 1.0 \\" in tex and r"50\% of \ensuremath{\$}x\_1 \#2 & \texttt{2} \\" in tex
    assert tex.rstrip().endswith("\\bottomrule\n\\end{tabular}\n\\end{fittable}")
    typ = export.typst(table)
    assert "columns: 2," in typ and "align: (left, right)," in typ
    assert 'table.header("kernel_name", "ms"),' in typ and '"50% of $x_1 #2",' in typ
    one = export.typst(export.Table("", cells[["ms"]], ["right"]))
    assert "align: (right,)," in one  # a one-element array


# a cell of each kind a report table holds, and every character LaTeX or Typst reads specially
TRICKY = {
    "part": [
        "[ddp (a)](#part-ddp) and [docs](https://example.org/a_b?x=1&y=2#top~1%20)",
        "[x] starts with a bracket",
        "*starred",
        r"all: \ _ % & # $ { } ~ ^ < > | * @ [ ] ` -- ' " + '"',
    ],
    "code": ["`a_b & {c} #d $e ^f ~g \\h <i> [j](k)`", "`--cores 1`", "plain", "`x` and `y`"],
    "symbols": ["⚠ suspect", "− ≥ ≤ × ± µ ² ᵀ · … → ≈", "☺ unnamed", "[see](figures/x.png)"],
}


def test_cells_lose_their_markdown_and_escape_every_special():
    table = export.Table("", pd.DataFrame(TRICKY), ["left"] * 3)
    tex = export.latex(table)
    tex = tex.replace(r"\allowbreak{}", "")  # a wrapped column's breaks
    assert r"\href{https://example.org/a_b?x=1\&y=2\#top\%7E1\%20}{docs}" in tex
    assert "ddp (a) and " in tex and "(#part" not in tex and "(figures/" not in tex
    assert "\n{}[x] starts with a bracket &" in tex and "\n{}*starred &" in tex
    assert (
        r"all: \textbackslash{} \_ \% \& \# \ensuremath{\$} \{ \} \textasciitilde{} \textasciicircum{} "
        r"\textless{} \textgreater{} \textbar{} * @ [ ] \`{} -{}- ' " + '"'
    ) in tex
    assert (
        r"\texttt{a\_b \& \{c\} \#d \ensuremath{\$}e \textasciicircum{}f \textasciitilde{}g "
        r"\textbackslash{}h \textless{}i\textgreater{} [j](k)}" in tex
    )  # a code span keeps its brackets: no link inside code
    assert r"\texttt{-{}-cores 1}" in tex and r"\texttt{x} and \texttt{y}" in tex
    assert r"\suspect{} suspect" in tex and r"\unicodechar{263A} unnamed" in tex
    assert (
        r"\minussign{} \geqsign{} \leqsign{} \timessign{} \pmsign{} \microsign{} \suptwosign{} "
        r"\transposesign{} \cdotsign{} \dotssign{} \arrowsign{} \approxsign{}"
    ) in tex
    assert r"& see \\" in tex  # a link to a file beside the report: its text
    assert not [c for c in tex if not c.isascii()]
    typ = export.typst(table)
    assert '[#"ddp (a) and "#link("https://example.org/a_b?x=1&y=2#top~1%20")[#"docs"]]' in typ
    assert '#raw("a_b & {c} #d $e ^f ~g \\\\h <i> [j](k)")' in typ
    assert '"all: \\\\ _ % & # $ { } ~ ^ < > | * @ [ ] ` -- \' \\""' in typ
    assert '[#raw("x")#" and "#raw("y")]' in typ and '"see"' in typ


def test_tricky_cells_compile_in_latex_and_typst(tmp_path):
    tables = tmp_path / "tables"
    export.write_tables({"tricky": export.Table("", pd.DataFrame(TRICKY), ["left"] * 3)}, tables)
    compile_typst(tables, ["tricky"], tmp_path)
    compile_latex(tables, ["tricky"], tmp_path, latex_or_skip("pdflatex"))


def test_numbers_align_right_and_on_their_plus_minus(tmp_path):
    cells = pd.DataFrame(
        {
            "size": ["small", "large"],
            "forward (ms)": ["20.95 ± 2.40", "–"],
            "train step of the whole model (ms)": ["150 ± 0.35 ⚠", "1,037 ± 0.67"],
            "share": ["12.5%", "3.1 ⚠"],
            "note": ["a long text that runs on, on and on past forty characters", "short"],
        }
    )
    table = export.Table("", cells, ["left"] * 5)  # the report left-aligns all of these
    assert export.column_kinds(table) == ["left", "pm", "pm", "right", "wrap"]
    tex = export.latex(table)
    pm = r"r@{\,\pmsign{}\,}l"
    assert rf"\begin{{tabular}}{{l{pm}{pm}r>{{\raggedright\arraybackslash}}p{{15em}}}}" in tex
    assert r"small & 20.95 & 2.40 & 150 & 0.35 \suspect{} & 12.5\% &" in tex
    assert r"large & \multicolumn{2}{c}{--} & 1,037 & 0.67 & 3.1 \suspect{} & short \\" in tex
    head = r"\multicolumn{2}{c}{\begin{tabular}[b]{@{}c@{}}train step of \\ the whole model \\"
    assert head in tex  # a long header over numbers in lines
    typ = export.typst(table)
    assert "columns: 7," in typ and "align: (left, right, left, right, left, right, left)," in typ
    assert "x in (2, 4,)" in typ and "x in (1, 3,)" in typ  # the halves close together
    assert '"small", "20.95", "± 2.40", "150", "± 0.35 ⚠", "12.5%",' in typ
    assert 'table.cell(colspan: 2, align: center, "–")' in typ
    tables = tmp_path / "tables"
    export.write_tables({"numbers": table}, tables)
    compile_typst(tables, ["numbers"], tmp_path)
    compile_latex(tables, ["numbers"], tmp_path, latex_or_skip("pdflatex"))


def test_the_report_writes_tables_html_and_links(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_results(tmp_path / "results" / "fixture-cpu", benchmark=benchmark_rows(),
                  ceilings=ceilings_rows())  # fmt: skip
    out = tmp_path / "report" / "fixture-cpu" / "report.md"
    report.main(["--results", "results/fixture-cpu", "--out", str(out), "--stages",
                 "ceilings,benchmark"])  # fmt: skip
    tables = out.parent / "tables"
    names = sorted(p.stem for p in tables.glob("*.tex") if p.stem != "preamble")
    assert {"ceilings_table", "report_coverage", "report_provenance"} <= set(names), names
    assert sorted(p.stem for p in tables.glob("*.typ")) == names
    assert (
        (tables / "ceilings_table.tex")
        .read_text()
        .startswith("\\begin{fittable}\n\\begin{tabular}")
    )
    assert (tables / "preamble.tex").read_text().count("\\providecommand") >= len(
        export.LATEX_SYMBOLS
    ) - 1
    # every table of the markdown has its copies (the header's literal one aside)
    md = out.read_text()
    rules = [line for line in md.splitlines() if re.match(r"^\|(?=.*-)[-:| ]+\|$", line)]
    assert len(names) == len(rules) - 1
    page = out.with_suffix(".html").read_text()
    assert page.startswith("<!DOCTYPE html>") and page.count("<table>") == len(rules)
    assert "<h2>Machine ceilings</h2>" in page and "| ---" not in page
    # raw captures (not kept with a copied report): named, the machine filled in, with the
    # command that writes them again, and no link that would be dead from a reference folder
    env = report.environment(results_dir="results/fixture-cpu", report_dir=out.parent)
    link = env.globals["raw_link"]("memory")
    assert link.startswith("`results/fixture-cpu/memory/raw/` (raw capture") and "](" not in link
    assert "--forcerun memory" in link


def test_the_html_page_embeds_figures_and_keeps_code_literal(tmp_path):
    png = tmp_path / "figures" / "x.png"
    png.parent.mkdir()
    png.write_bytes(b"\x89PNG\r\n\x1a\nfake")
    md = (
        "# Title\n\nSome *text* with `a_b|c <d>` and a [link](https://x.org).\n\n"
        "| name | ms |\n|:---|---:|\n| `k<T>` | 1.5 |\n\n- one\n  continued\n- two\n\n"
        "![fig](figures/x.png)\n\n```python\nx = a_b * 2\n```\n"
    )
    page = to_html(md, tmp_path)
    assert "<em>text</em>" in page and "<code>a_b|c &lt;d&gt;</code>" in page
    assert '<a href="https://x.org">link</a>' in page
    assert '<td style="text-align:right">1.5</td>' in page and "<code>k&lt;T&gt;</code>" in page
    assert "<li>one continued</li><li>two</li>" in page
    assert 'src="data:image/png;base64,' in page
    assert '<pre><code class="language-python">x = a_b * 2</code></pre>' in page
