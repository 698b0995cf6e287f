"""The FlashAttention section's notes in words: what the latency table's columns hold, and where
a forward+backward timed as one call measures the host rather than the kernels (flash_benchmarking
(a)). A point is host-bound when its forward+backward takes more than HOST_RATIO times its
forward plus its backward timed apart: the one call pays autograd's and the launches' host work
that the GPU idles through, which the passes timed apart overlap with their own kernels."""

from __future__ import annotations

import pandas as pd

from cs336_systems.reporting.analysis import fmt, plural

HOST_RATIO = 1.25
# the most host time one forward+backward call of ours took on our H100 hosts (0.30-0.58 ms,
# docs/flash-attention-notes.md, the fixed host cost rounds): a GPU point whose one call exceeds
# its passes timed apart by more than this is not explained by the host's work alone
HOST_GAP_MS = 0.6
SHORT = {"naive_eager": "naive", "flash_pytorch": "FA2-pt", "flash_triton": "FA2-triton"}
LONG = {
    "naive_eager": "naive PyTorch attention",
    "flash_pytorch": "our FlashAttention-2 in PyTorch",
    "flash_triton": "our FlashAttention-2 in Triton",
}


def pair_caption(impls: list[str]) -> str:
    """The latency table's implementations, as its columns hold them (only those)."""
    named = [f"{LONG[i]} (`{SHORT[i]}`)" for i in SHORT if i in impls]
    return ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1] if named else ""


def host_bound(d: pd.DataFrame) -> pd.DataFrame:
    """The trusted sweep rows with their ratio forward+backward / (forward + backward)."""
    need = {"fwd_ms_median", "bwd_ms_median", "fwd_bwd_ms_median"}
    if d.empty or not need <= set(d):
        return d.iloc[:0]
    r = d["fwd_bwd_ms_median"] / (d["fwd_ms_median"] + d["bwd_ms_median"])
    return d.assign(host_ratio=r)


def host_note(d: pd.DataFrame, ours: str = "flash_triton") -> str:
    """Where our kernel's forward+backward is host-bound, with the worst example and the length
    from which it is not."""
    h = host_bound(d[d["impl"] == ours])
    if h.empty:
        return ""
    hit = h[h["host_ratio"] > HOST_RATIO]
    if hit.empty:
        return (
            f"Our kernel's forward+backward takes at most {h['host_ratio'].max():.2f}× its "
            "forward plus its backward timed apart at every point: no speed-up below is the "
            "host's."
        )
    w = hit.loc[hit["host_ratio"].idxmax()]
    clean = sorted(set(h["seq_len"]) - set(hit["seq_len"]))
    longest = int(hit["seq_len"].max())
    return (
        f"At {plural(len(hit), 'point')} of {len(h)} (n up to {longest:,}) our kernel's "
        f"forward+backward, timed as one call, takes {hit['host_ratio'].min():.2f}–"
        f"{hit['host_ratio'].max():.2f}× its forward plus its backward timed apart (the worst: "
        f"{w['dtype']}, d = {int(w['d_head'])}, n = {int(w['seq_len']):,}: "
        f"{fmt(w['fwd_ms_median'], 3)} + {fmt(w['bwd_ms_median'], 3)} against "
        f"{fmt(w['fwd_bwd_ms_median'], 3)} ms). The one call pays the host's work (autograd, "
        "the launches) while the device waits, so forward+backward times and speed-ups at those "
        "points measure host overhead, not the kernels"
        + (
            f"; from n = {min(n for n in clean if n > longest):,} on the two agree within "
            f"{HOST_RATIO - 1:.0%}."
            if any(n > longest for n in clean)
            else "."
        )
        + _gap_note(hit)
    )


def _gap_note(hit: pd.DataFrame) -> str:
    """GPU points whose one call takes more than HOST_GAP_MS beyond its passes timed apart:
    more than the host's whole call, so not the host's work alone."""
    if "device" not in hit:
        return ""
    gap = hit["fwd_bwd_ms_median"] - hit["fwd_ms_median"] - hit["bwd_ms_median"]
    big = hit[(hit["device"].astype(str) == "cuda") & (gap > HOST_GAP_MS)]
    if big.empty:
        return ""
    each = "; ".join(
        f"{r['dtype']}, d = {int(r['d_head'])}, n = {int(r['seq_len']):,}: "
        f"{fmt(r['fwd_bwd_ms_median'], 3)} ms against {fmt(r['fwd_ms_median'], 3)} + "
        f"{fmt(r['bwd_ms_median'], 3)}"
        for _, r in big.iterrows()
    )
    return (
        f" Not so at {plural(len(big), 'point')} ({each}): the extra time exceeds the "
        f"{HOST_GAP_MS} ms that a whole call of ours takes on the host, so the host's work does "
        "not explain it; that point needs measuring again before its speed-up is read."
    )
