"""The report a grader reads, rendered from committed runs' CSVs (report/reference/<run>/csv) and
from the finished tiny run: a summary of findings first, the answers numbered in the handout's
order at the length each part asks (the rest in collapsible details), and no table twice."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from cs336_systems.reporting import digest, questions, report
from cs336_systems.reporting.markdown import to_html

ROOT = Path(__file__).resolve().parents[2]
# a CPU run of the 2026 edition, a GPU run of the 2025 one
RUNS = {"cpu": "2026", "h100-80gb-hbm3-2025": "2025"}
LEAD = re.compile(r"^\*\*[^*]*\(Q\d+[^*]*\*\*\s*")  # an answer's bold title


@pytest.fixture(scope="module", params=sorted(RUNS))
def rendered(request) -> tuple[str, str]:
    csv = ROOT / "report" / "reference" / request.param / "csv"
    if not csv.is_dir():
        pytest.skip(f"no committed run {request.param}")
    return report.render(csv, report.all_stages()), RUNS[request.param]


def tables_of(markdown: str) -> list[str]:
    return ["\n".join(b) for b in digest.blocks(markdown.splitlines()) if digest.kind(b) == "table"]


def repeated_tables(markdown: str) -> list[str]:
    return [t for t, n in Counter(tables_of(markdown)).items() if n > 1]


def test_the_report_opens_with_a_summary_of_findings_linking_each_answer(rendered):
    text, _ = rendered
    summary = text[text.index("## Summary of findings") : text.index("## Coverage")]
    assert text.index("## Summary of findings") < text.index("## Coverage")
    links = re.findall(r"^- \[Q(\d+)\. [^\]]*\]\(#q(\d+)\)", summary, re.M)
    assert len(links) >= 10 and all(a == b for a, b in links)
    for _, anchor in links:
        assert f'<a name="q{anchor}"></a>' in text  # each line links to its answer
    numbers = [int(n) for n in re.findall(r"^- \[?Q(\d+)\.", summary, re.M)]
    assert numbers == sorted(numbers)
    # each line is the answer's own first sentence
    first = re.search(r"^- \[Q(\d+)\.[^\n]*?\): (.+)$", summary, re.M)
    answer = text[text.index(f'<a name="q{first.group(1)}"></a>') :]
    assert first.group(2).rstrip(".")[:40] in answer.split(digest.OPEN)[0]
    # "see its figure" only where no sentence opens the answer (the DDP overlap's paragraph
    # once ran into the list of its traces and read as the figure's caption)
    for q in re.findall(r"^- \[Q(\d+)\.[^\n]*: see its (?:figure|table)\.$", summary, re.M):
        shown = text[text.index(f'<a name="q{q}"></a>') :].split(digest.OPEN)[0]
        opening = next(
            b for b in digest.blocks(shown.splitlines()[1:]) if digest.kind(b) != "heading"
        )
        assert digest.kind(opening) != "prose" or len(" ".join(opening)) < 200, (q, opening)


def test_the_summary_names_each_part_not_answered_here_with_its_reason(rendered):
    text, _ = rendered
    summary = text[text.index("## Summary of findings") : text.index("## Coverage")]
    coverage = next(
        b for b in digest.blocks(text[text.index("## Coverage") :].splitlines())
        if digest.kind(b) == "table"
    )  # fmt: skip
    head = [c.strip() for c in coverage[0].strip("|").split("|")]
    rows = [dict(zip(head, [c.strip() for c in r.strip("|").split("|")], strict=False))
            for r in coverage[2:]]  # fmt: skip
    missing = [r for r in rows if r["status"] == "not" and r["kind"] != "code"]
    assert missing, "the committed runs leave parts unanswered"
    for r in missing:
        label = re.match(r"\[([^\]]+)\]", r["part"]).group(1)
        line = next(x for x in summary.splitlines() if x.startswith("- ") and label in x)
        assert r["why"] in line


def test_answers_are_numbered_in_the_handouts_order(rendered):
    text, _ = rendered
    numbers = [int(n) for n in re.findall(r"^### Q(\d+)\.", text, re.M)]
    assert len(numbers) >= 10 and numbers == sorted(numbers) and len(set(numbers)) == len(numbers)
    anchors = [int(n) for n in re.findall(r'^<a name="q(\d+)"></a>', text, re.M)]
    assert anchors == sorted(anchors)
    # the coverage table names the same numbers as the headings
    for n, title in re.findall(r"\| Q(\d+) \(([^)|]+)\) in \[", text):
        assert questions.ANSWERS[next(k for k, v in questions.report_numbers().items()
                                      if v == int(n))] == title  # fmt: skip


def test_each_answer_shows_the_asked_length_and_folds_the_rest(rendered):
    text, edition = rendered
    lengths = digest.answer_lengths(edition)
    back = {v: k for k, v in questions.report_numbers().items()}
    chunks = re.split(r'^<a name="q(\d+)"></a>$', text, flags=re.M)
    folded = 0
    for n, chunk in zip(chunks[1::2], chunks[2::2], strict=True):
        visible = chunk.split(digest.OPEN)[0]
        visible = re.split(r"^#{1,2} |^### (?!Q)", visible, flags=re.M)[0]
        length = lengths.get(back[int(n)], digest.Length(sentences=2))
        said = sum(
            len(digest.wrapped_sentences(LEAD.sub("", " ".join(b))))
            for b in digest.blocks(visible.splitlines())
            # a table's lead-in ("...:") is its caption, not a sentence of the answer
            if digest.kind(b) == "prose" and not b[-1].rstrip().endswith(":")
        )
        assert said <= max(length.sentences, 1) + length.paragraphs * 20, (n, visible[:300])
        folded += digest.OPEN in chunk
    assert folded >= 5
    html = to_html(text)
    assert html.count("<details>") == html.count("</details>") == text.count(digest.OPEN)
    assert "&lt;details" not in html


def test_no_table_appears_twice(rendered):
    text, _ = rendered
    assert repeated_tables(text) == []


def test_no_table_appears_twice_in_the_tiny_runs_report(finished_tiny_run):
    text = (finished_tiny_run / "report" / "tiny-test" / "report.md").read_text()
    assert "## Summary of findings" in text
    assert repeated_tables(text) == []
