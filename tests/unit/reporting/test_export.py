"""The write-up export: every report table as LaTeX (booktabs) and Typst under
report/<machine>/tables/, every figure also as PDF, the report as one HTML page, raw captures
as links (reporting/export.py, reporting/markdown.py, reporting/report.py)."""

from __future__ import annotations

import re

import pandas as pd
from fixture_rows import benchmark_rows, ceilings_rows, write_results

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
    assert tex.splitlines()[:3] == [r"\begin{tabular}{lr}", r"\toprule", r"kernel\_name & ms \\"]
    assert r"a \& b & 1.0 \\" in tex and r"50\% of \$x\_1 \#2 & \texttt{2} \\" in tex
    assert tex.rstrip().endswith("\\bottomrule\n\\end{tabular}")
    typ = export.typst(table)
    assert "columns: 2," in typ and "align: (left, right)," in typ
    assert 'table.header("kernel_name", "ms"),' in typ and '"50% of $x_1 #2",' in typ
    one = export.typst(export.Table("", cells[["ms"]], ["right"]))
    assert "align: (right,)," in one  # a one-element array


def test_the_report_writes_tables_html_and_links(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_results(tmp_path / "results" / "fixture-cpu", benchmark=benchmark_rows(),
                  ceilings=ceilings_rows())  # fmt: skip
    out = tmp_path / "report" / "fixture-cpu" / "report.md"
    report.main(["--results", "results/fixture-cpu", "--out", str(out), "--stages",
                 "ceilings,benchmark"])  # fmt: skip
    tables = out.parent / "tables"
    names = sorted(p.stem for p in tables.glob("*.tex"))
    assert {"ceilings_table", "report_coverage", "report_provenance"} <= set(names), names
    assert sorted(p.stem for p in tables.glob("*.typ")) == names
    assert (tables / "ceilings_table.tex").read_text().startswith("\\begin{tabular}")
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
