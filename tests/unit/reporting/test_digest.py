"""The report cut to the handout's lengths (reporting/digest.py): what each deliverable asks,
sentences, answers folded into a visible part and details, the summary's lines, the numbers."""

from __future__ import annotations

import pytest

from cs336_systems.reporting import digest, questions
from cs336_systems.reporting.digest import Length


@pytest.mark.parametrize(
    ("deliverable", "length"),
    [
        ("1-2 sentences", Length(sentences=2)),
        ("2-3 sentences with timings", Length(sentences=3, tables=1)),
        ("a table, two numbers per context", Length(sentences=1, tables=1)),
        ("two timeline images and 2-3 sentences", Length(sentences=3, figures=2)),
        ("Nsight screenshots and 1-2 paragraphs", Length(paragraphs=2, figures=1)),
        ("two expressions and two sentences", Length(sentences=4)),
        ("an inequality and one sentence", Length(sentences=2)),
        ("the time per step per bucket size and 3-4 sentences", Length(sentences=4, tables=1)),
        ("plot(s) and/or table(s) and 2-3 sentences", Length(sentences=3, tables=1, figures=1)),
    ],
)
def test_asked_length_reads_the_deliverable(deliverable, length):
    assert digest.asked_length(deliverable) == length


def test_every_written_part_of_both_editions_asks_a_length():
    for edition in questions.EDITIONS:
        lengths = digest.answer_lengths(edition)
        for part in questions.edition_parts(edition):
            if part["kind"] != "code" and part["answer"]:
                got = lengths[part["answer"]]
                assert got.sentences or got.paragraphs, part["id"]


def test_sentences_split_at_ends_not_at_numbers_or_abbreviations():
    text = (
        "The step takes 1.5 ms, e.g. Q1's forward. Each step takes S/W. The ring takes "
        "2 (N-1)/N S/W (vs. Rabenseifner). _A note._ 3 points ran."
    )
    assert digest.sentences(text) == [
        "The step takes 1.5 ms, e.g. Q1's forward.",
        "Each step takes S/W.",
        "The ring takes 2 (N-1)/N S/W (vs. Rabenseifner).",
        "_A note._",
        "3 points ran.",
    ]
    assert digest.wrapped_sentences("_Skipped: no GPU. Run it there._") == [
        "_Skipped: no GPU._",
        "_Run it there._",
    ]


SECTION = """intro of the section

### Q5. Forward time

One. Two. Three. Four
across lines.

| a | b |
|---|---|
| 1 | 2 |

![fig](figures/x.png)

- an item

#### A sub-heading

More.

### Q6. The kernel

Short answer.

### Q7. Non-matmul

Kept as the context split it. Two. Three.

<!-- details -->

Its details.
"""


def test_fold_keeps_the_asked_sentences_and_puts_the_rest_in_details():
    lengths = {5: Length(sentences=2), 6: Length(sentences=2), 7: Length(sentences=1)}
    text, shown = digest.fold(SECTION, lengths)
    q5 = text[text.index("### Q5") : text.index('<a name="q6"')]
    visible, details = q5.split(digest.OPEN)
    assert "One. Two." in visible and "Three" not in visible and "| a |" not in visible
    assert details.index("Three. Four across lines.") < details.index("| a | b |")
    assert details.index("| a | b |") < details.index("![fig]") < details.index("#### A sub")
    assert details.rstrip().endswith(digest.CLOSE)
    # blank lines around the markdown inside the block (GitHub renders it then)
    assert f"\n\n{digest.OPEN}\n\n" in q5 and f"\n\n{digest.CLOSE}" in q5
    # an answer within its length has no details; a context's own split is kept as it is
    q6 = text[text.index("### Q6") : text.index('<a name="q7"')]
    assert digest.OPEN not in q6 and "Short answer." in q6
    q7 = text[text.index("### Q7") :]
    assert "Kept as the context split it. Two. Three." in q7.split(digest.OPEN)[0]
    assert "Its details." in q7.split(digest.OPEN)[1] and "<!-- details -->" not in text
    assert text.startswith("intro of the section") and '<a name="q5"></a>' in text
    assert digest.first_sentence(shown[5]) == "One."


def test_fold_shows_a_table_or_figure_where_the_deliverable_is_one():
    text, _ = digest.fold(SECTION, {5: Length(sentences=1, tables=1, figures=1)})
    q5 = text[text.index("### Q5") : text.index('<a name="q6"')]
    visible = q5.split(digest.OPEN)[0]
    assert "| a | b |" in visible and "![fig]" in visible and "Two." not in visible


def test_fold_reads_a_bold_led_answer_and_a_table_introduced_by_a_colon():
    md = "**Alternate ring (Q34).** T = (N-1) S / W. It is slower.\n\nThe times:\n\n| x |\n|---|\n| 1 |\n"
    text, shown = digest.fold(md, {34: Length(sentences=1)})
    visible, details = text.split(digest.OPEN)
    assert "**Alternate ring (Q34).** T = (N-1) S / W." in visible and "slower" not in visible
    assert "The times:" in details and "| x |" in details  # the lead-in follows its table
    assert digest.first_sentence(shown[34]) == "T = (N-1) S / W."


def test_summary_lines_follow_the_numbers_and_skip_what_is_not_answered():
    shown = {2: "Warm-up costs 3x. Details.", 1: "| a |\n|---|\n| 1 |", 3: "_Skipped: no GPU._"}
    status = {1: "answered", 2: "partly", 3: "not", 4: "answered"}
    lines = digest.summary_lines(
        shown, status, own={1: "Forward takes 2 ms."}, where={4: "[memory](#memory)"},
        order={2: 1, 1: 2, 4: 3},
    )  # fmt: skip
    assert lines[0].startswith("- [Q2. Warm-up](#q2) _(partly)_: Warm-up costs 3x.")
    assert lines[1].endswith(": Forward takes 2 ms.") and "(#q1)" in lines[1]
    assert "[memory](#memory)" in lines[2] and len(lines) == 3
    rows = [("a (x)", "not", "needs a GPU"), ("b (y)", "not", "needs a GPU"), ("c", "ok", "")]
    assert digest.not_answered_lines(rows) == ["- a (x), b (y): needs a GPU"]


def test_renumber_rewrites_headings_references_and_anchors_alike():
    md = '<a name="q28"></a>\n\n### Q28. Block\n\nSee Q13 and [Q28](#q28); `path/Q1x` stays.'
    out = digest.renumber(md, {28: 18, 13: 13})
    assert (
        out == '<a name="q18"></a>\n\n### Q18. Block\n\nSee Q13 and [Q18](#q18); `path/Q1x` stays.'
    )


def test_report_numbers_follow_the_sections_order():
    """The answers numbered by their stage's section (ORDER), the handout's order: memory's
    part (f) right after its other parts, checkpointing before attention, the arithmetic of
    section 8 before the leaderboard of section 9."""
    numbers = questions.report_numbers()
    assert sorted(numbers.values()) == list(range(1, len(questions.ANSWERS) + 1))
    assert numbers[17] + 1 == numbers[28]  # memory (e), then (f)
    assert numbers[28] < numbers[29] < numbers[31] < numbers[18]  # checkpointing, attention
    assert numbers[36] < numbers[37]  # the 2026 handout's sections 8 and 9
    declared, orders = questions.declarations(), questions.stage_orders()
    for a, b in zip(sorted(numbers, key=numbers.get), sorted(numbers, key=numbers.get)[1:]):
        stage = {
            k: max(
                (st for p in questions.PARTS if p["answer"] == k
                 for st in questions.answered_by(p["id"], declared)),
                key=lambda st, k=k: (sum(
                    st in questions.answered_by(p["id"], declared)
                    for p in questions.PARTS if p["answer"] == k
                ), -orders[st]),  # a tie goes to the earlier section
            )
            for k in (a, b)
        }  # fmt: skip
        assert orders[stage[a]] <= orders[stage[b]], (a, b, stage)


def test_a_caption_goes_with_its_table_and_is_no_summary():
    md = (
        "### Q22. All-reduce\n\n**nccl**: median time\n\n| a |\n|---|\n| 1 |\n\n"
        "**gloo**: median time\n\n| b |\n|---|\n| 2 |\n\n- nccl rises 7.6x. More.\n- gloo rises.\n"
    )
    text, shown = digest.fold(md, {22: Length(sentences=1, tables=1)})
    visible, details = text.split(digest.OPEN)
    assert "**nccl**: median time" in visible and "| a |" in visible
    assert "**gloo**: median time" in details and "| b |" in details
    assert "- nccl rises 7.6x. More." in visible and "gloo rises" in details
    assert digest.first_sentence(shown[22]) == "nccl rises 7.6x."
