"""A write-up from a finished run: every table the report exported (reporting/export.py) compiles,
all in one LaTeX document with pdfLaTeX (and LuaLaTeX where installed) and all in one Typst
document, without a character dropped or a table wider than a landscape page; the figures' PDFs
carry no Type 3 font."""

from __future__ import annotations

import re

import pytest
from writeup_checks import compile_latex, compile_typst, latex_or_skip, table_names

MACHINE = "tiny-test"


@pytest.fixture(scope="module")
def tables(finished_tiny_run):
    folder = finished_tiny_run / "report" / MACHINE / "tables"
    assert (folder / "preamble.tex").exists()
    assert len(table_names(folder)) >= 5, table_names(folder)  # the tiny run has 8
    return folder


def test_every_table_compiles_in_typst(tables, tmp_path):
    names = table_names(tables)
    compile_typst(tables, names, tmp_path)
    for name in names:  # Markdown read, not printed: no link syntax, no code span's backticks
        typ = (tables / f"{name}.typ").read_text()
        assert not re.search(r'"[^"]*\]\((#|https?:)', typ), name


def test_every_table_compiles_with_pdflatex(tables, tmp_path):
    compile_latex(tables, table_names(tables), tmp_path, latex_or_skip("pdflatex"))


def test_every_table_compiles_with_lualatex(tables, tmp_path):
    compile_latex(tables, table_names(tables), tmp_path, latex_or_skip("lualatex", required=False))


def test_figures_embed_no_type3_font(finished_tiny_run):
    pdfs = sorted((finished_tiny_run / "report" / MACHINE / "figures").glob("*.pdf"))
    assert pdfs
    for pdf in pdfs:
        data = pdf.read_bytes()
        assert b"/Type3" not in data and b"/FontFile2" in data, pdf.name
