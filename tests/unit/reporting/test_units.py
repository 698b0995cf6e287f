"""Units as written: a size counted in 2^20 bytes is MiB and one in 2^30 bytes GiB, never "MB" or
"GB" (10^6, 10^9 bytes). The check reads the source: every f-string, dict key and template
expression that prints a binary size (an `_mb` column, `MiB`, `2**20`, ...) next to "MB" or
"GB". KNOWN lists exceptions still to fix (a fixed one left in it fails too)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pandas as pd

from cs336_systems.reporting.analysis import md_table, mib

ROOT = Path(__file__).resolve().parents[3]
SRC = ROOT / "src" / "cs336_systems"
TEMPLATES = ROOT / "report" / "templates"
# a value counted in binary units: an `_mb`/`_mib`/`_gib` name, MiB/GiB, 2**20, 2**30, 1 << 20
BINARY = re.compile(r"_mb\b|_mib\b|_gib\b|\bMiB\b|\bGiB\b|2\s*\*\*\s*(?:20|30)|<<\s*(?:20|30)")
DECIMAL_UNIT = re.compile(r"^\s*[MG]B\b(?!/s)")  # "MB", "GB" (not a bandwidth's GB/s)
UNIT_IN_KEY = re.compile(r"\b[MG]B\b(?!/s)")

# (file relative to src/cs336_systems or report/templates, the printed code) found 2026-11-28
KNOWN: set[tuple[str, str]] = set()


def _fstring_hits(tree: ast.AST) -> set[str]:
    """The printed expressions of f-strings followed by a literal "MB"/"GB" that count in binary
    units (a name in BINARY, or a variable named for a bucket or size in MiB)."""
    hits = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        for value, after in zip(node.values, node.values[1:], strict=False):
            if not (isinstance(value, ast.FormattedValue) and isinstance(after, ast.Constant)):
                continue
            code = ast.unparse(value.value)
            if DECIMAL_UNIT.match(str(after.value)) and (BINARY.search(code) or code == "bucket"):
                hits.add(code)
    return hits


def _dict_key_hits(tree: ast.AST) -> set[str]:
    """Table columns named "... MB" whose values count in binary units."""
    hits = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and UNIT_IN_KEY.search(str(key.value)):
                    code = ast.unparse(value)
                    if BINARY.search(code):
                        hits.add(code.removeprefix("sig(").removesuffix(")"))
    return hits


def binary_sizes_printed_as_decimal() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(SRC).as_posix()
        found |= {(rel, code) for code in _fstring_hits(tree) | _dict_key_hits(tree)}
    for path in sorted(TEMPLATES.rglob("*.j2")):
        for m in re.finditer(r"\{\{([^}]*)\}\}\s*[MG]B\b(?!/s)", path.read_text()):
            if BINARY.search(m.group(1)):
                found.add((path.relative_to(TEMPLATES).as_posix(), m.group(1).strip()))
    return found


def test_no_binary_size_is_printed_as_mb_or_gb():
    found = binary_sizes_printed_as_decimal()
    assert found - KNOWN == set(), "print MiB/GiB (reporting/analysis.py: mib)"
    assert KNOWN - found == set(), "fixed: remove from KNOWN"


def test_the_check_finds_what_it_looks_for():
    tree = ast.parse(
        'f"{size_mb:g} MB"; f"{x / 2**30:.1f} GB"; f"{gbps} GB/s"; f"{n} MB"\n'
        '{"S MB": sig(h["message_mb"]), "W GB/s": w}'
    )
    assert _fstring_hits(tree) == {"size_mb", "x / 2 ** 30"}
    assert _dict_key_hits(tree) == {"h['message_mb']"}


def test_mib_prints_binary_units():
    assert mib(812.4) == "812 MiB" and mib(1536) == "1.50 GiB" and mib(0.0625) == "0.0625 MiB"
    assert mib(float("nan")) == "–"


def test_a_tables_binary_columns_say_their_unit():
    text = md_table(pd.DataFrame({"size": ["xl"], "params_mb": [812.0], "need_gib": [1.5]}))
    header = text.splitlines()[0]
    assert "params (MiB)" in header and "need (GiB)" in header and "_mb" not in header
    assert "812" in text.splitlines()[2]
