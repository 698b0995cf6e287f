"""reporting/markdown.py: a stage's CSV as the page Snakemake's report shows."""

from __future__ import annotations

import re

from cs336_systems.reporting.markdown import csv_page


def test_a_csv_page_shows_every_cell_numbers_right_aligned(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text('size,step_ms_mean,status\nsmall,1.5,ok\n<b>,,"error: a, b"\nlarge,2e3,ok\n')
    page = csv_page(csv, "t.csv")
    assert page.startswith("<!DOCTYPE html>") and "<title>t.csv</title>" in page
    rows = re.findall(r"<tr>(.*?)</tr>", page)
    assert len(rows) == 4  # the header and three rows
    assert re.findall(r"<th( class=\"n\")?>", rows[0]) == ["", ' class="n"', ""]
    assert '<td class="n">2e3</td>' in rows[3] and "<td>large</td>" in rows[3]
    assert "<td>&lt;b&gt;</td>" in rows[2] and "<td>error: a, b</td>" in rows[2]
    assert "3 rows, 3 columns." in page


def test_a_long_csv_page_says_how_many_rows_it_shows(tmp_path):
    csv = tmp_path / "long.csv"
    csv.write_text("i\n" + "".join(f"{i}\n" for i in range(30)))
    page = csv_page(csv, "long.csv", max_rows=10)
    assert page.count("<tr>") == 11 and "30 rows, 1 columns, the first 10 shown." in page
