"""What the workflow needs to check the ceilings stage's config block (no torch)."""

from __future__ import annotations

from cs336_systems.core.config import Checker, Facts, device_memory

BYTES = {"bf16": 2, "fp16": 2, "tf32": 4, "fp32": 4}


def size_of(cfg: dict) -> dict[str, int]:
    """Each measured dtype's matmul size: `matmul_size`, or its entry in `matmul_size_of`."""
    return {d: cfg.get("matmul_size_of", {}).get(d, cfg["matmul_size"]) for d in cfg["dtypes"]}


def sizes_of(cfg: dict) -> dict[str, list[int]]:
    """Every square size each dtype is measured at: its own size, then its `extra_sizes`."""
    extra = cfg.get("extra_sizes", {})
    return {d: list(dict.fromkeys([n, *extra.get(d, [])])) for d, n in size_of(cfg).items()}


def cli_extra(cfg: dict) -> str:
    """`extra_sizes` as the stage's --extra-sizes argument ('bf16=4096+16384,fp32=2048', or '')."""
    return ",".join(
        f"{d}={'+'.join(map(str, ns))}"
        for d, ns in sorted(cfg.get("extra_sizes", {}).items())
        if ns
    )


def extra_by_dtype(text: str) -> dict[str, list[int]]:
    """--extra-sizes's 'bf16=4096+16384,fp32=2048' as a mapping ('' is none)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        dtype, _, ns = item.partition("=")
        if dtype not in BYTES or not all(n.isdigit() for n in ns.split("+")):
            raise ValueError(f"--extra-sizes: {item!r} is not <dtype>=<size>[+<size>...]")
        out[dtype] = [int(n) for n in ns.split("+")]
    return out


def cli_sizes(cfg: dict) -> str:
    """`matmul_size_of` as the stage's --matmul-size-of argument ('fp32=1024', or '')."""
    return ",".join(f"{d}={n}" for d, n in sorted(cfg.get("matmul_size_of", {}).items()))


def sizes_by_dtype(text: str) -> dict[str, int]:
    """--matmul-size-of's 'fp32=1024,bf16=512' as a mapping ('' is none)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        dtype, _, n = item.partition("=")
        if dtype not in BYTES or not n.isdigit():
            raise ValueError(
                f"--matmul-size-of: {item!r} is not <dtype>=<size> ({', '.join(BYTES)})"
            )
        out[dtype] = int(n)
    return out


def check(cfg: dict, at: Checker, facts: Facts) -> None:
    """Sizes that fit the device's memory, where knowable: the copy's source and destination,
    the matmul's two operands and its product."""
    have, where = device_memory(facts)
    at.fits("copy_mb", cfg["copy_mb"], 2 * cfg["copy_mb"], have, where)
    widest: dict[int, str] = {}  # each size once, at its widest dtype
    for dtype, ns in sizes_of(cfg).items():
        for n in ns:
            if n not in widest or BYTES[dtype] > BYTES[widest[n]]:
                widest[n] = dtype
    extra = {n for ns in cfg.get("extra_sizes", {}).values() for n in ns}
    for n, dtype in widest.items():
        key = (
            "matmul_size"
            if n == cfg["matmul_size"]
            else f"extra_sizes.{dtype}"
            if n in extra and n != cfg.get("matmul_size_of", {}).get(dtype)
            else f"matmul_size_of.{dtype}"
        )
        at.fits(key, n, 3 * n * n * BYTES[dtype] / 2**20, have, where)
