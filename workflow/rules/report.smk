# The report: renders report/<machine>/report.md from every enabled stage's CSVs and figures,
# with report.html (the same, one page) and tables/ (LaTeX and Typst copies of its tables).

# the stage tables among the report's inputs, each also written as a page Snakemake's report shows
TABLE_CSVS = [
    str(f)
    for stage in STAGES
    for f in REPORT_INPUTS.get(stage, [])
    if str(f) in REPORT_TABLES
]


rule report:
    input:
        # (as plain paths: a report item is its producing rule's, caption and all)
        data=lambda wc: [
            str(f) for stage in STAGES for f in REPORT_INPUTS.get(stage, [])
        ],
        # reporting/report.py imports each stage's analysis by name, reads every stage's declarations
        # (questions for the coverage table, checks) and renders the stages' templates. Written
        # while the rules are read, not by an input function: Snakemake lists a folder's files
        # once, and a stamp written after that listing reads as missing.
        code=code_stamp(
            "report",
            "cs336_systems.reporting.report",
            *(f"cs336_systems.stages.{s}.analysis" for s in STAGES),
            extra=[
                "report/templates/report.md.j2",
                *(f"report/templates/sections/{s}.md.j2" for s in STAGES),
                *(f"src/cs336_systems/stages/{s}/__init__.py" for s in STAGE_NAMES),
            ],
        ),
    output:
        md=f"{REPORT_DIR}/report.md",
        # the same report as one page, figures embedded: the first page of Snakemake's report
        html=report(
            f"{REPORT_DIR}/report.html",
            caption="../report/report.rst",
            category=REPORT_CATEGORY,
            labels={"page": "report.md"},
        ),
        # every table of the report as LaTeX (booktabs) and Typst, for a write-up
        tables=directory(f"{REPORT_DIR}/tables"),
        # every stage table as a page (its CSV is offered for download only)
        pages=[table_page(csv) for csv in TABLE_CSVS],
    log:
        f"{RESULTS}/logs/report.log",
    localrule: True
    params:
        stages=lambda wc: cli_list(s for s in STAGES if s in REPORT_INPUTS),
        results=lambda wc, output: f"results/{Path(output[0]).parent.name}",
        # the run's edition (config `edition`), whatever a stage's rows say
        edition=EDITION,
        table_pages=cli_list(TABLE_CSVS),
        pages=lambda wc, output: parent(output.pages[0]) if output.pages else ".",
    shell:
        "$PY -m cs336_systems.reporting.report --results {params.results} --out {output.md}"
        " --stages {params.stages} --edition {params.edition}"
        " --table-pages {params.table_pages:q} --pages {params.pages} 2>&1 | $TEE {log}"
