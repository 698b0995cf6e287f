"""Compiling the report's exported tables (reporting/export.py) as a write-up would: every table
of a folder in one LaTeX document (pdfLaTeX, LuaLaTeX) and one Typst document.

pdfLaTeX comes from the system (`apt-get install texlive-latex-base texlive-latex-recommended`,
as .ci/run does); where it is missing a test skips, unless CS336_REQUIRE_LATEX=1 (CI) makes
that a failure. Typst is the `typst` package of the dev dependencies."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

# the tables in a landscape A4 page's width with 2 cm margins, as a write-up's appendix sets them
DOCUMENT = r"""\documentclass{article}
\usepackage[a4paper,landscape,margin=2cm]{geometry}
\input{preamble}
\usepackage{hyperref}
\begin{document}
%s
\end{document}
"""


def latex_or_skip(engine: str = "pdflatex", required: bool = True) -> str:
    """The engine's path; a skip where it is missing (a failure under CS336_REQUIRE_LATEX=1
    where `required`)."""
    path = shutil.which(engine)
    if path:
        return path
    reason = (
        f"{engine} is not installed (apt-get install texlive-latex-base texlive-latex-recommended)"
    )
    if required and os.environ.get("CS336_REQUIRE_LATEX") == "1":
        pytest.fail(f"CS336_REQUIRE_LATEX=1 but {reason}")
    pytest.skip(reason)


def table_names(tables: Path) -> list[str]:
    return sorted(p.stem for p in tables.glob("*.tex") if p.stem != "preamble")


def compile_latex(tables: Path, names: list[str], workdir: Path, engine: str) -> str:
    """Every table of `names` in one document, compiled once by `engine`; returns its log. Fails
    on an error, a character the fonts lack and a table wider than the page. No font is made on
    the fly (MKTEXPK=0: a bitmap font would be a Type 3 font)."""
    body = "\n".join(rf"\noindent\input{{{n}}}\par\medskip" for n in names)
    (workdir / "tables.tex").write_text(DOCUMENT % body)
    env = {**os.environ, "TEXINPUTS": f"{tables}:", "MKTEXPK": "0", "MKTEXTFM": "0"}
    run = subprocess.run(
        [engine, "-interaction=nonstopmode", "-halt-on-error", "tables.tex"],
        cwd=workdir,
        capture_output=True,
        env=env,
        timeout=300,
    )
    log_file = workdir / "tables.log"
    log = log_file.read_text(errors="replace") if log_file.exists() else ""
    errors = [line for line in log.splitlines() if line.startswith("!")]
    assert run.returncode == 0, (errors or log[-3000:], run.stdout[-2000:])
    assert (workdir / "tables.pdf").read_bytes().startswith(b"%PDF")
    missing = re.findall(r"Missing character: .*", log)
    assert not missing, missing[:5]
    overfull = re.findall(r"Overfull \\hbox \(([\d.]+)pt too wide\)", log)
    assert all(float(w) < 1 for w in overfull), overfull
    return log


def compile_typst(tables: Path, names: list[str], workdir: Path) -> bytes:
    """Every table of `names` in one Typst document (beside copies of them); returns the PDF."""
    import typst

    folder = workdir / "typst"
    shutil.copytree(tables, folder, dirs_exist_ok=True)
    main = folder / "tables.typ"
    main.write_text("\n".join(f'#include "{n}.typ"' for n in names) + "\n")
    pdf = typst.compile(str(main), root=str(folder))
    assert pdf.startswith(b"%PDF")
    return pdf
