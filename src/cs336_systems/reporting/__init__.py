"""Reporting: from a run's CSVs to its report. Analysis helpers (tables, figures), suspect
numbers (`sanity`), the handouts' parts and what a run answers (`questions`, `coverage`),
LaTeX/Typst tables (`export`), Markdown helpers, the stage aggregates (`aggregate`), the
report itself (`report`) and the comparison of machines (`compare`).

The top floor: it reads what the measuring floors wrote; nothing below imports it.
"""
