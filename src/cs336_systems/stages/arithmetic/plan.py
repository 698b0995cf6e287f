"""What the workflow needs to plan and check the arithmetic stage (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts

# the other stages' CSVs the stage reads, when those stages run: {option: (stage, file)}
SOURCES = {"ceilings": ("ceilings", "ceilings.csv"), "allreduce": ("allreduce", "allreduce.csv")}


def inputs(stages: list[str], results: str) -> dict[str, str]:
    """{option: path} of the input CSVs whose stages are in this run (the rule's inputs)."""
    return {opt: f"{results}/{name}" for opt, (stage, name) in SOURCES.items() if stage in stages}


def input_args(paths: dict[str, str]) -> str:
    """The CLI options naming the input CSVs (an absent one is reported as missing)."""
    return " ".join(f"--{opt} {path}" for opt, path in sorted(paths.items()))


def shape_arg(cfg: dict) -> str:
    return ",".join(f"{s['name']}:{s['tokens']}:{s['d_model']}:{s['d_ff']}" for s in cfg["shapes"])


def split_arg(cfg: dict) -> str:
    return ",".join(f"{f}x{t}" for f, t in cfg["splits"])


def xxl_arg(cfg: dict) -> str:
    x = cfg["xxl"]
    return f"{x['d_model']}:{x['d_ff']}:{x['blocks']}"


def tpu_arg(cfg: dict) -> str:
    """C TFLOP/s : W_ici GB/s : HBM GB : X x Y : M_X x M_Y."""
    t = cfg["tpu"]
    return (
        f"{t['tflops']}:{t['ici_gbps']}:{t['hbm_gb']}:{t['mesh'][0]}x{t['mesh'][1]}"
        f":{t['axes'][0]}x{t['axes'][1]}"
    )


def options(cfg: dict) -> str:
    """Every option of the job but the inputs and the common ones."""
    return (
        f"--shapes {shape_arg(cfg)} --devices {','.join(map(str, cfg['devices']))}"
        f" --splits {split_arg(cfg)} --message-mb {cfg['message_mb']}"
        f" --b200-tflops {cfg['b200']['tflops']} --b200-egress-gbps {cfg['b200']['egress_gbps']}"
        f" --xxl {xxl_arg(cfg)} --tpu {tpu_arg(cfg)} --h100-gb {cfg['h100_gb']}"
        f" --dtypes {','.join(cfg['measured']['dtypes'])}"
        f" --backends {','.join(cfg['measured']['backends'])}"
    )


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """Shape names are unique (they key the rows); a split of at least two devices."""
    names = [s["name"] for s in cfg["shapes"]]
    for i, name in enumerate(names):
        if name in names[:i]:
            at.fail(("shapes", i, "name"), name, "a name no other shape has (it keys the rows)")
    for i, (f, t) in enumerate(cfg["splits"]):
        if f * t < 2:
            at.fail(("splits", i), [f, t], "N_FSDP x N_TP of at least 2 devices")
