# Transformer-training systems study: `snakemake --cores 1 report` runs every stage and writes
# report/<machine>/report.md. Stages live in workflow/rules/<stage>.smk, their work in
# src/cs336_systems/. See README.md.
from glob import glob


configfile: "config/config.yaml"


include: "workflow/rules/common.smk"


# every stage's rules file between the frame (common) and the report, in a stable order
for _rules in sorted(glob(f"{workflow.basedir}/workflow/rules/*.smk")):
    if not _rules.endswith(("/common.smk", "/report.smk")):

        include: _rules


include: "workflow/rules/report.smk"


rule all:
    default_target: True
    input:
        rules.report.output,
