# Transformer-training systems study: `snakemake --cores 1 report` runs every stage and writes
# report/<machine>/report.md. Stages live in workflow/rules/<stage>.smk, their work in
# src/cs336_systems/. See README.md.
from pathlib import Path


configfile: "config/config.yaml"


# Snakemake's own report (`snakemake --report report.zip` after a run): this description, and
# every figure and table of the study with its caption (workflow/report/)
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


# every stage's rules file between the frame (common) and the report, in a stable order
for _rules in sorted(Path(workflow.basedir, "workflow", "rules").glob("*.smk")):
    if _rules.name not in ("common.smk", "report.smk", "compare.smk"):

        include: str(_rules)


isolate_measuring_jobs()


include: "workflow/rules/report.smk"
include: "workflow/rules/compare.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
