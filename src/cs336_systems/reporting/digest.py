"""The rendered report made readable for a grader: each answer cut to the length its handout part
asks, the rest in a collapsible block; the answers numbered in the handout's order; a summary of
findings first, one line per answer, computed from the answers themselves.

An answer is a `### Q<n>. ...` heading and what follows it up to the next heading of level 3 or
above, or a paragraph led by a bold title naming `(Q<n>)` and what follows it up to the next such
paragraph or heading. Its first sentences, up to the length of the parts it answers
(`questions.PARTS`' `deliverable`: "1-2 sentences", "a table", "a plot", ...), stay visible; the
rest goes into `<details><summary>Details</summary> ... </details>`. A context that splits its
answer itself writes `DETAILS` (`<!-- details -->`) on a line of its own between the two: the
part before it stays whole and visible, the rest goes into the block as it is.

Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cs336_systems.reporting.questions import ANSWERS, PARTS

DETAILS = "<!-- details -->"
OPEN, CLOSE = "<details><summary>Details</summary>", "</details>"

_HEADING = re.compile(r"^(#{1,6})\s")
_Q_HEADING = re.compile(r"^###\s+Q(\d+)\.")
_Q_BOLD = re.compile(r"^\*\*([^*]*?\(Q(\d+)\b[^*]*?)\*\*")
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5}
_ABBREVIATION = re.compile(r"(?:\be\.g|\bi\.e|\bvs|\bcf|\bFig|\bapprox|\betc|\bresp)$")
# a sentence ends at . ! or ? (closing marks may follow) before a space and a capital, a digit or
# an opening mark; not after an abbreviation, nor inside a number (1.5)
_SENTENCE_END = re.compile(r"(?<=[.!?])[)\]_*\"'`]*\s+(?=[A-Z0-9(\[_*`\"'])")


@dataclass(frozen=True)
class Length:
    """What an answer shows before its details: `sentences` of prose (or `paragraphs` whole
    paragraphs), and the first `tables` tables and `figures` figures."""

    sentences: int = 0
    paragraphs: int = 0
    tables: int = 0
    figures: int = 0

    def __add__(self, other: Length) -> Length:
        return Length(
            self.sentences + other.sentences,
            self.paragraphs + other.paragraphs,
            max(self.tables, other.tables),
            self.figures + other.figures,
        )


def _count(word: str) -> int:
    """ "2-3" -> 3, "two" -> 2, "a" -> 1."""
    if m := re.fullmatch(r"(\d+)(?:-(\d+))?", word):
        return int(m.group(2) or m.group(1))
    return _NUMBER_WORDS.get(word.lower(), 1)


def asked_length(deliverable: str) -> Length:
    """The length a part's deliverable asks for, from its words: "2-3 sentences" is 3
    sentences, "1-2 paragraphs" 2 paragraphs, "a table" a table, "two timeline images" 2
    figures; an expression, equation or calculation counts as a sentence; with no count of
    sentences, one sentence leads what it asks for."""
    text = deliverable.lower()
    word = r"(\d+(?:-\d+)?|a|an|one|two|three|four|five)"

    def total(noun: str) -> int:
        return sum(_count(w) for w in re.findall(rf"\b{word}\s+(?:\w+\s+)?{noun}", text))

    sentences = total(r"sentences?")
    sentences += total(r"(?:expressions?|equations?|inequalit(?:y|ies)|calculations?)")
    sentences += len(
        re.findall(r"\bthe (?:calculation|derivation|backward pass's equations)", text)
    )
    paragraphs = total(r"paragraphs?")
    figures = total(r"(?:images?|screenshots?|plots?)") or int(
        bool(re.search(r"plot|image|screenshot", text))
    )
    tables = int(bool(re.search(r"table|data types|timings|the times|time per step", text)))
    if not sentences and not paragraphs:
        sentences = 1 if tables or figures else 2
    return Length(sentences, paragraphs, tables, figures)


def answer_lengths(edition: str) -> dict[int, Length]:
    """Each answer's length (a key of ANSWERS): the sum over the parts of `edition` it answers."""
    out: dict[int, Length] = {}
    for part in PARTS:
        if part["answer"] and str(edition) in part["editions"] and part["kind"] != "code":
            out[part["answer"]] = out.get(part["answer"], Length()) + asked_length(
                part["deliverable"]
            )
    return out


def sentences(text: str) -> list[str]:
    """`text` (one paragraph) cut into sentences."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        before = text[start : m.start()].rstrip(".!?)]_*\"'`")
        if _ABBREVIATION.search(before):
            continue
        out.append(text[start : m.start() + len(m.group(0).rstrip())].strip())
        start = m.end()
    out.append(text[start:].strip())
    return [s for s in out if s]


# ------------------------------------------------------------------------------ answers in blocks


def blocks(lines: list[str]) -> list[list[str]]:
    """Markdown lines as blocks: runs of lines between blank lines, a fenced code block whole."""
    out: list[list[str]] = []
    cur: list[str] = []
    fenced = False
    for line in lines:
        if line.strip().startswith("```"):
            fenced = not fenced
        if not line.strip() and not fenced:
            if cur:
                out.append(cur)
            cur = []
        else:
            cur.append(line)
    if cur:
        out.append(cur)
    return out


def kind(block: list[str]) -> str:
    """`table`, `figure`, `list`, `heading`, `code`, `html`, `mark` (DETAILS) or `prose`."""
    first = block[0].strip()
    if first == DETAILS:
        return "mark"
    if first.startswith("|"):
        return "table"
    if first.startswith("!["):
        return "figure"
    if re.match(r"^([-*]|\d+\.)\s+", first):
        return "list"
    if _HEADING.match(first):
        return "heading"
    if first.startswith("```"):
        return "code"
    if first.startswith("<"):
        return "html"
    return "prose"


def _prose_cut(block: list[str], budget: int, lead: str = "") -> tuple[str, str, int]:
    """(the first `budget` sentences of a prose block, the rest, sentences used); `lead`, a
    bold title at its start, is kept before them and not counted."""
    text = " ".join(line.strip() for line in block)
    body = text[len(lead) :].strip() if lead and text.startswith(lead) else text
    said = wrapped_sentences(body)
    if _unbalanced(" ".join(said[:budget])):  # a cut inside `code` or **bold**
        said = [body]
    head = " ".join(said[:budget])
    if lead and text.startswith(lead):
        head = f"{lead} {head}".strip()
    return head, " ".join(said[budget:]), min(budget, len(said))


def wrapped_sentences(text: str) -> list[str]:
    """`sentences`, each in the italics that wrap the whole text (`_a note. Its why._`)."""
    if len(text) > 2 and text[0] == text[-1] == "_" and not _unbalanced(text[1:-1]):
        return [f"_{x}_" for x in sentences(text[1:-1])]
    return sentences(text)


def _unbalanced(text: str) -> bool:
    """Whether a cut leaves a code span, bold or italics open."""
    text = re.sub(r"`[^`]*`", "", text)
    italics = len(re.findall(r"(?<![\w*])_|_(?![\w*])", text))
    return text.count("`") % 2 == 1 or text.count("**") % 2 == 1 or italics % 2 == 1


def _list_cut(block: list[str], budget: int, lead: str = "") -> tuple[str, str, int]:
    """(the first `budget` items of a list block, the other items, items shown)."""
    items: list[list[str]] = []
    for line in block:
        if re.match(r"^([-*]|\d+\.)\s+", line) or not items:
            items.append([line])
        else:
            items[-1].append(line)  # a continuation of the item
    head = "\n".join(line for item in items[:budget] for line in item)
    rest = "\n".join(line for item in items[budget:] for line in item)
    return head, rest, min(budget, len(items))


def caption(block: list[str], next_kind: str | None) -> bool:
    """Whether a prose block introduces the table or list after it: it ends with ":", or it is
    one line that ends no sentence ("**nccl**: median time per all-reduce")."""
    if next_kind not in ("table", "list", "figure"):
        return False
    last = block[-1].rstrip()
    return last.endswith(":") or (
        len(block) == 1 and not last.rstrip("_*").endswith((".", "!", "?"))
    )


def split_answer(body: list[str], length: Length, lead: str = "") -> tuple[list[str], list[str]]:
    """(the blocks shown, the blocks put in the details) of one answer's body (the lines after
    its heading), as markdown blocks (strings)."""
    parts = blocks(body)
    kinds = [kind(b) for b in parts]
    if "mark" in kinds:
        cut = kinds.index("mark")
        return ["\n".join(b) for b in parts[:cut]], ["\n".join(b) for b in parts[cut + 1 :]]
    shown: list[str] = []
    hidden: list[str] = []
    left = {"sentences": length.sentences, "paragraphs": length.paragraphs,
            "table": length.tables, "figure": length.figures}  # fmt: skip
    for i, (block, k) in enumerate(zip(parts, kinds, strict=True)):
        if k == "heading":  # a sub-heading and all under it are details
            hidden += ["\n".join(b) for b in parts[i:]]
            break
        nxt = kinds[i + 1] if i + 1 < len(kinds) else None
        if k == "prose" and caption(block, nxt):  # it goes where what it introduces goes
            show = left[nxt] > 0 if nxt in ("table", "figure") else left["sentences"] > 0
            (shown if show else hidden).append("\n".join(block))
        elif k == "prose" and left["paragraphs"] > 0:
            shown.append("\n".join(block))
            left["paragraphs"] -= 1
        elif k in ("prose", "list") and left["sentences"] > 0:
            cut = _prose_cut if k == "prose" else _list_cut
            head, rest, used = cut(block, left["sentences"], lead if i == 0 else "")
            left["sentences"] -= used
            shown.append(head)
            hidden += [rest] if rest else []
        elif k in ("table", "figure") and left[k] > 0:
            shown.append("\n".join(block))
            left[k] -= 1
        else:
            hidden.append("\n".join(block))
    return shown, hidden


def _answer_spans(lines: list[str]) -> list[tuple[int, int, int, str]]:
    """(start, end, answer key, bold lead or "") of each answer in the report's lines: a `### Q<n>.`
    heading's body, or a bold `(Q<n>)` paragraph and what follows it; `end` excluded."""
    starts = []
    for i, line in enumerate(lines):
        if m := _Q_HEADING.match(line):
            starts.append((i, int(m.group(1)), ""))
        elif (m := _Q_BOLD.match(line)) and (i == 0 or not lines[i - 1].strip()):
            starts.append((i, int(m.group(2)), m.group(0)))
    spans = []
    for i, key, lead in starts:
        j = i + 1
        while j < len(lines) and not _ends_answer(lines, j):
            j += 1
        spans.append((i, j, key, lead))
    return spans


def _ends_answer(lines: list[str], j: int) -> bool:
    line = lines[j]
    if (m := _HEADING.match(line)) and len(m.group(1)) <= 3:
        return True
    if line.startswith(("<a id=", "<a name=")) or line.strip() in (OPEN, CLOSE):
        return True
    return bool(_Q_BOLD.match(line)) and not lines[j - 1].strip()


def _details(hidden: list[str]) -> list[str]:
    """The collapsible block, blank lines around the markdown inside (GitHub renders it so)."""
    return ["", OPEN, "", "\n\n".join(hidden), "", CLOSE] if hidden else []


def fold(markdown: str, lengths: dict[int, Length]) -> tuple[str, dict[int, str]]:
    """(`markdown` with each answer cut to its length and the rest in details, an anchor
    `<a name="q<n>">` before each answer (a name, as sections are told apart by `<a id`);
    {answer: its visible text}). An answer of no known length (an edition's answer it does not
    ask, a study's own) keeps two sentences."""
    lines = markdown.splitlines()
    out: list[str] = []
    shown_by: dict[int, str] = {}
    at = 0
    for start, end, key, lead in _answer_spans(lines):
        out += lines[at:start]
        body = lines[start:end] if lead else lines[start + 1 : end]
        shown, hidden = split_answer(body, lengths.get(key, Length(sentences=2)), lead)
        if not shown and hidden:  # nothing fits the length (a lone list): show its first block
            shown, hidden = hidden[:1], hidden[1:]
        shown_by.setdefault(key, "\n\n".join(shown))
        out += [f'<a name="q{key}"></a>', ""]
        out += [] if lead else [lines[start], ""]
        out += ["\n\n".join(shown), *_details(hidden), ""]
        at = end
    out += lines[at:]
    text = "\n".join(out)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text + ("\n" if markdown.endswith("\n") and not text.endswith("\n") else ""), shown_by


def first_sentence(shown: str) -> str:
    """An answer's first sentence of prose, its bold title left out; else what it shows."""
    parts = blocks(shown.splitlines())
    for i, block in enumerate(parts):
        if kind(block) == "prose" and caption(
            block, kind(parts[i + 1]) if i + 1 < len(parts) else None
        ):
            continue
        if kind(block) == "list":
            block = _list_cut(block, 1)[0].splitlines()
            block[0] = re.sub(r"^\s*([-*]|\d+\.)\s+", "", block[0])
        elif kind(block) != "prose":
            continue
        text = " ".join(line.strip() for line in block)
        text = _Q_BOLD.sub("", text).strip()
        said = [x for x in wrapped_sentences(text) if not x.rstrip("_").endswith(":")]
        if said:
            return said[0]
    kinds = {kind(b) for b in blocks(shown.splitlines())}
    return "see its table." if "table" in kinds else "see its figure." if "figure" in kinds else ""


# -------------------------------------------------------------------------------------- summary


def answer_status(part_ids: list[str], statuses: list[str]) -> dict[int, str]:
    """Each answer's status from its parts' (the coverage table's rows, in `part_ids`' order):
    `answered` if every part is, `not` if none is, else `partly`."""
    by_id = {p["id"]: p for p in PARTS}
    found: dict[int, list[str]] = {}
    for pid, status in zip(part_ids, statuses, strict=True):
        answer = by_id[pid].get("answer")
        if answer and by_id[pid]["kind"] != "code":
            found.setdefault(answer, []).append(status)
    out = {}
    for answer, got in found.items():
        out[answer] = (
            "answered" if all(s == "answered" for s in got)
            else "not" if all(s == "not" for s in got)
            else "partly"
        )  # fmt: skip
    return out


def summary_lines(
    shown_by: dict[int, str],
    status: dict[int, str],
    own: dict[int, str] | None = None,
    where: dict[int, str] | None = None,
    order: dict[int, int] | None = None,
) -> list[str]:
    """One line per answer of the edition this report gives (answered or partly), in `order`
    (the report's numbers): its number and title linking to it, and its first sentence (or the
    sentence its context gives under `summary`); an answer with no heading of its own links to
    its section (`where`: answer -> a markdown link)."""
    own, where, order = own or {}, where or {}, order or {}
    keys = [k for k in dict.fromkeys([*shown_by, *status]) if status.get(k) not in (None, "not")]
    lines = []
    for key in sorted(keys, key=lambda k: order.get(k, k)):
        partly = " _(partly)_" if status.get(key) == "partly" else ""
        title = f"Q{key}. {ANSWERS.get(key, '')}"
        if key in shown_by:
            said = own.get(key) or first_sentence(shown_by[key])
            lines.append(f"- [{title}](#q{key}){partly}: {said}")
        else:
            said = own.get(key) or "answered in its section, under no heading of its own."
            lines.append(f"- {title}{partly} ({where.get(key, 'its section')}): {said}")
    return lines


def not_answered_lines(rows: list[tuple[str, str, str]]) -> list[str]:
    """(part label, status, why) rows of the coverage table: the parts not answered on this
    machine, one line per reason."""
    why_parts: dict[str, list[str]] = {}
    for label, status, why in rows:
        if status == "not":
            why_parts.setdefault(why or "no reason recorded", []).append(label)
    return [f"- {', '.join(labels)}: {why}" for why, labels in why_parts.items()]


def renumber(text: str, numbers: dict[int, int]) -> str:
    """Every `Q<n>` (and the anchors `q<n>`) of the rendered report with the number the report
    shows (questions.report_numbers): the answers in the handout's order."""

    def swap(m: re.Match) -> str:
        return f"{m.group(1)}{numbers.get(int(m.group(2)), int(m.group(2)))}"

    text = re.sub(r"(?<![\w/-])(Q)(\d+)\b", swap, text)
    return re.sub(r"((?:#|id=\"|name=\")q)(\d+)\b", swap, text)
