"""The report's markdown as one self-contained HTML page (its figures embedded), for Snakemake's
own report (`snakemake --report`) and for a browser.

It reads the subset the report's templates write: ATX headings, paragraphs, pipe tables (with
their alignment row), `-` and `1.` lists, fenced code, `<a id>` anchors, `<details>` blocks
(reporting/digest.py) and comments, and inline code spans,
links, autolinks, images, bold and italics. Standard library only.
"""

from __future__ import annotations

import base64
import csv
import html
import mimetypes
import re
from pathlib import Path

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem;
       line-height: 1.45; color: #1f2328; }
table { border-collapse: collapse; margin: 0.8rem 0; font-size: 0.85rem; display: block;
        overflow-x: auto; }
th, td { border: 1px solid #d0d7de; padding: 0.25rem 0.5rem; }
th { background: #f6f8fa; }
tr:nth-child(even) td { background: #fafbfc; }
code { background: #f6f8fa; padding: 0.1rem 0.25rem; border-radius: 4px; font-size: 0.85em; }
pre { background: #f6f8fa; padding: 0.8rem; overflow-x: auto; }
pre code { padding: 0; }
img { max-width: 100%; }
h1, h2 { border-bottom: 1px solid #d0d7de; padding-bottom: 0.3rem; }
details { margin: 0.5rem 0 1rem; padding: 0 0.8rem; border-left: 3px solid #d0d7de; }
summary { cursor: pointer; color: #57606a; }
"""

# a table's page: as wide as the window, its header on top while its rows scroll
CSV_STYLE = """
body { max-width: none; margin: 1rem; }
table { display: table; white-space: nowrap; }
thead th { position: sticky; top: 0; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; }
"""
# rows of a CSV shown on its page (the CSV beside it holds them all)
MAX_CSV_ROWS = 5000

_CODE = re.compile(r"`([^`]+)`")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_AUTOLINK = re.compile(r"&lt;(https?://[^\s&]+)&gt;")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])[_*](?![\s_*])(.+?)(?<![\s_*])[_*](?![\w*])")
_ANCHOR = re.compile(r'^<a (?:id|name)="([\w-]+)"></a>$')
_RAW = re.compile(r"^(<details>(<summary>[^<]*</summary>)?|</details>|<!--.*-->)$")
_RULE = re.compile(r"^\|?\s*:?-{2,}:?\s*(\|\s*:?-{2,}:?\s*)*\|?$")


def _data_uri(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    mime = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def inline(text: str, base: Path | None) -> str:
    """One line's inline markup as HTML (code spans first: nothing inside them is markup)."""
    spans: list[str] = []

    def keep(html_text: str) -> str:
        spans.append(html_text)
        return f"\0{len(spans) - 1}\0"

    text = _CODE.sub(lambda m: keep(f"<code>{html.escape(m.group(1))}</code>"), text)
    text = html.escape(text, quote=False)

    def image(m: re.Match) -> str:
        src = m.group(2)
        uri = _data_uri(base / src) if base is not None and "://" not in src else None
        return keep(f'<img alt="{html.escape(m.group(1))}" src="{html.escape(uri or src)}">')

    text = _IMAGE.sub(image, text)
    text = _LINK.sub(lambda m: keep(f'<a href="{html.escape(m.group(2))}">{m.group(1)}</a>'), text)
    text = _AUTOLINK.sub(lambda m: keep(f'<a href="{m.group(1)}">{m.group(1)}</a>'), text)
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    text = _ITALIC.sub(r"<em>\1</em>", text)
    return re.sub(r"\0(\d+)\0", lambda m: spans[int(m.group(1))], text)


def _cells(line: str) -> list[str]:
    line = line.strip()
    line = line[1:] if line.startswith("|") else line
    line = line[:-1] if line.endswith("|") and not line.endswith("\\|") else line
    return [c.strip() for c in re.split(r"(?<!\\)\|", line)]


def _table(lines: list[str], base: Path | None) -> str:
    head, rule, body = _cells(lines[0]), _cells(lines[1]), [_cells(x) for x in lines[2:]]
    align = ["right" if r.endswith(":") and not r.startswith(":") else "left" for r in rule]
    align += ["left"] * (len(head) - len(align))

    def row(cells: list[str], tag: str) -> str:
        tds = "".join(
            f'<{tag} style="text-align:{a}">{inline(c, base)}</{tag}>'
            for c, a in zip(cells, align, strict=False)
        )
        return f"<tr>{tds}</tr>"

    rows = "\n".join(row(cells, "td") for cells in body)
    return f"<table>\n<thead>{row(head, 'th')}</thead>\n<tbody>\n{rows}\n</tbody>\n</table>"


def to_html(markdown: str, base: str | Path | None = None, title: str = "") -> str:
    """The page: `markdown` as HTML, images read from `base` (the markdown's folder) and
    embedded as data URIs."""
    base = Path(base) if base is not None else None
    lines = markdown.splitlines()
    out: list[str] = []
    para: list[str] = []
    i = 0

    def flush() -> None:
        if para:
            out.append(f"<p>{inline(' '.join(para), base)}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        if not stripped:
            flush()
            i += 1
        elif stripped.startswith("```"):
            flush()
            lang = stripped[3:].strip()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith("```"):
                j += 1
            code = html.escape("\n".join(lines[i + 1 : j]))
            cls = f' class="language-{html.escape(lang)}"' if lang else ""
            out.append(f"<pre><code{cls}>{code}</code></pre>")
            i = j + 1
        elif m := re.match(r"^(#{1,6})\s+(.*)$", stripped):
            flush()
            level = len(m.group(1))
            out.append(f"<h{level}>{inline(m.group(2), base)}</h{level}>")
            i += 1
        elif _RAW.match(stripped):  # a collapsible block's tags, a comment: as they are
            flush()
            out.append(stripped)
            i += 1
        elif m := _ANCHOR.match(stripped):
            flush()
            out.append(f'<a id="{m.group(1)}"></a>')
            i += 1
        elif stripped.startswith("|") and i + 1 < len(lines) and _RULE.match(lines[i + 1].strip()):
            flush()
            j = i + 2
            while j < len(lines) and lines[j].strip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j], base))
            i = j
        elif re.match(r"^([-*]|\d+\.)\s+", stripped):
            flush()
            ordered = bool(re.match(r"^\d+\.", stripped))
            items: list[list[str]] = []
            while i < len(lines) and lines[i].strip():
                item = re.match(r"^\s*([-*]|\d+\.)\s+(.*)$", lines[i])
                if item and (not lines[i].startswith(" ") or not items):
                    items.append([item.group(2)])
                elif items:
                    items[-1].append(lines[i].strip())  # a continuation of the item
                i += 1
            tag = "ol" if ordered else "ul"
            lis = "".join(f"<li>{inline(' '.join(x), base)}</li>" for x in items)
            out.append(f"<{tag}>{lis}</{tag}>")
        else:
            para.append(stripped)
            i += 1
    flush()
    return _page("\n".join(out), title)


def _page(body: str, title: str, style: str = STYLE) -> str:
    head = f"<title>{html.escape(title)}</title>" if title else ""
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"{head}\n<style>{style}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def csv_page(path: str | Path, title: str, max_rows: int = MAX_CSV_ROWS) -> str:
    """A CSV as one self-contained HTML page: its rows as a table (numbers right-aligned), the
    first `max_rows` where it has more, the header held in view. Snakemake's report shows an
    HTML item in its page, and offers any other file (a CSV) only for download."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    head, body = (rows[0], rows[1:]) if rows else ([], [])
    shown = body[:max_rows]
    numeric = [
        any(col) and all(_is_number(c) for c in col if c) for col in zip(*shown, strict=False)
    ]

    classes = ['<{0} class="n">' if n else "<{0}>" for n in numeric]

    def cells(row: list[str], tag: str) -> str:
        opens = [classes[j] if j < len(classes) else "<{0}>" for j in range(len(row))]
        return "".join(f"{o.format(tag)}{html.escape(c)}</{tag}>" for o, c in zip(opens, row))

    more = f", the first {len(shown):,} shown" if len(shown) < len(body) else ""
    lines = [
        f"<h1>{html.escape(title)}</h1>",
        f"<p>{len(body):,} rows, {len(head)} columns{more}.</p>",
        f"<table>\n<thead><tr>{cells(head, 'th')}</tr></thead>\n<tbody>",
        *(f"<tr>{cells(r, 'td')}</tr>" for r in shown),
        "</tbody>\n</table>",
    ]
    return _page("\n".join(lines), title, STYLE + CSV_STYLE)
