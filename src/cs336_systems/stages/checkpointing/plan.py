"""What the workflow needs to plan (and check) the checkpointing stage, from its config block.

Pure functions of the preset block (no torch): the model's size table is read from model.py's
source (``core.edition.size_table``), so a block size that does not divide the layer count
is refused while planning, before any job, in the run's one-line form (core/config.py).
"""

from __future__ import annotations

from cs336_systems.core.edition import DEFAULT_EDITION, size_table

NESTED = ("sqrt", "halving", "chain")


def num_layers(cfg: dict, edition: int = DEFAULT_EDITION) -> int | None:
    """The layer count the strategies run over: `num_layers` if set, else the size's own."""
    if "num_layers" in cfg:
        return cfg["num_layers"]
    spec = size_table(edition).get(cfg["size"])
    return spec["num_layers"] if spec else None


def vocab_arg(cfg: dict) -> str:
    """`--vocab-size V` where the block overrides the study's vocabulary, else nothing."""
    return f"--vocab-size {cfg['vocab_size']}" if "vocab_size" in cfg else ""


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def strategies(cfg: dict) -> list[str]:
    """Every strategy the block runs, in the report's order: none, every_<k>, the nested ones."""
    return ["none", *(f"every_{k}" for k in cfg["block_sizes"]), *cfg["nested"]]


def problems(cfg: dict, edition: int = DEFAULT_EDITION) -> list[tuple[tuple, object, str]]:
    """(key path inside the preset block, value, what is allowed) for each problem the schema
    cannot see: sizes of the model table, block sizes that divide the layer count, a compiled
    accounting on the meta device through the real compiler."""
    out = []
    sizes = size_table(edition)
    for key, size in (("size",), cfg["size"]), (("accounting", "size"), cfg["accounting"]["size"]):
        if size not in sizes:
            out.append(
                (key, size, f"a model size of the {edition} edition: one of {', '.join(sizes)}")
            )
    n = num_layers(cfg, edition)
    if n is not None:
        allowed = ", ".join(map(str, divisors(n)))
        for i, k in enumerate(cfg["block_sizes"]):
            if n % k:
                out.append(
                    (
                        ("block_sizes", i),
                        k,
                        f"a divisor of the {n} layers of {cfg['size']}: {allowed}",
                    )
                )
    acc = cfg["accounting"]
    if acc["device"] == "meta" and acc["compile_backend"] == "inductor":
        out.append(
            (
                ("accounting", "compile_backend"),
                "inductor",
                "partition on the meta device (inductor generates code for real devices only)",
            )
        )
    return out


def check(cfg: dict, at, facts=None) -> None:
    """The stage's checks for core/config.py's check_run (`at` collects problems under the
    block's path)."""
    edition = facts.edition if facts is not None else DEFAULT_EDITION
    for path, value, allowed in problems(cfg, edition):
        at.fail(path, value, allowed)
