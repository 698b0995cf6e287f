# The comparison report: machines side by side from their results folders. Not part of the
# default `report` target: `snakemake --cores 1 compare --config 'compare={machines: [cpu, h100-80gb-hbm3]}'`.


rule compare:
    input:
        data=compare_inputs,
        template="report/templates/compare.md.j2",
        # reporting/compare.py reads every stage's package (what it compares) and its analysis (how)
        code=code_stamp(
            "compare",
            "cs336_systems.reporting.compare",
            *(f"cs336_systems.stages.{s}.analysis" for s in STAGE_NAMES),
        ),
    output:
        "report/compare/report.md",
    log:
        "report/compare/compare.log",
    localrule: True
    params:
        folders=lambda wc: " ".join(
            compare_folder(m) for m in config["compare"]["machines"]
        ),
    shell:
        "$PY -m cs336_systems.reporting.compare --out {output} {params.folders} 2>&1 | $TEE {log}"
