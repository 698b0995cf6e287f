"""The `ddp` section's answers in words, each from the runs it names (those that passed the
sanity checks): the setup, the compute-only step, naive DDP (Q23), one flattened all-reduce
(Q24), overlap with backward (Q25), the bucket sizes against the overhead model and against
per-parameter overlap, PyTorch's DistributedDataParallel beside our fastest wrapper (Q26), and
optimizer-state sharding (Q27)."""

from __future__ import annotations

import math

import pandas as pd

from cs336_systems.core.costs import MiB, optimal_bucket
from cs336_systems.planning.edition import DEFAULT_EDITION, size_table
from cs336_systems.reporting import sanity
from cs336_systems.reporting.analysis import fmt, ok, own_model_words, pct
from cs336_systems.stages.ddp.peer import BUCKET_MB
from cs336_systems.stages.ddp.plan import HANDOUT_SIZE
from cs336_systems.stages.ddp.rows import is_suspect_run, one, optimizer_names


def inner(n: int) -> str:
    """'1 suspect point excluded: see Suspect numbers' (sanity.excluded without its brackets),
    for a note inside a sentence's own parentheses; '' for none."""
    return sanity.excluded(n).strip()[1:-1]


def missing(d: pd.DataFrame, variants: tuple[str, ...], failed: str) -> str:
    """What a question says when a run it needs has no sentence: suspect, or did not succeed."""
    return sanity.missing_answer([v for v in variants if is_suspect_run(d, v)], failed, " and the ")


def optimizers(df: pd.DataFrame) -> str:
    """'AdamW (`adamw_fused`)', the implementation the runs record (`model.optimizer_impl`);
    where they differ, the variant table names each run's; 'AdamW' where none is recorded."""
    names = optimizer_names(df)
    if not names:
        return "AdamW"
    if len(names) == 1:
        return f"AdamW (`{names[0]}`)"
    return "AdamW (" + ", ".join(f"`{n}`" for n in names) + ": each run's in the table)"


def model_text(spec: dict) -> str:
    return (
        f"d_model {int(spec['d_model'])}, d_ff {int(spec['d_ff'])}, {int(spec['num_layers'])} "
        f"layers, {int(spec['num_heads'])} heads"
    )


def _edition(first: pd.Series) -> int:
    value = first.get("edition", DEFAULT_EDITION)
    return DEFAULT_EDITION if pd.isna(value) else int(value)


def edition_model(first: pd.Series) -> str:
    """The model the runs trained, named in its edition's table (its shape from the row, or
    from the table for rows older than the shape columns)."""
    if own := own_model_words(first):  # docs/own-model.md
        return own
    edition = _edition(first)
    size = str(first["size"])
    spec = {k: first[k] for k in ("d_model", "d_ff", "num_layers", "num_heads") if k in first}
    if len(spec) < 4 or pd.isna(spec["d_model"]):
        spec = size_table(edition).get(size)
    text = f"the {edition} edition's `{size}`"
    if spec:
        text += f" ({model_text(spec)}; {fmt(first['params'] / 1e6, 1)} M parameters)"
    return text


def handout_model(first: pd.Series) -> str:
    """Where the runs' model is not the one the edition's handout asks for (a preset's small
    model), which one it asks for; '' where it is."""
    edition, size = _edition(first), str(first["size"])
    if size == HANDOUT_SIZE:
        return ""
    spec = model_text(size_table(edition)[HANDOUT_SIZE])
    return (
        f"`{size}` is the {first.get('preset', 'this')} preset's model, not the one the "
        f"{edition} handout asks for, its `{HANDOUT_SIZE}` ({spec}), which the gpu and full "
        "presets run: no number below is that model's."
    )


def setup(df: pd.DataFrame) -> str:
    """The model, batch, backend, optimizer and step counts the runs share (the first row's)."""
    first = df.iloc[0]
    tensors = df.get("num_grad_tensors", pd.Series(dtype=float)).dropna()
    per_step = f", {int(tensors.iloc[0])} gradient tensors" if len(tensors) else ""
    return (
        f"model {edition_model(first)}{per_step}, context "
        f"{int(first['context_length'])}, batch {int(first['batch_per_rank'])} per rank, "
        f"{first['backend']} with {int(first['world_size'])} processes"
        f"{' (one per GPU)' if first['backend'] == 'nccl' else ' on the CPU'}, "
        f"fp32, {optimizers(df)}; {int(first['warmup_steps'])} warm-up and "
        f"{int(first['measure_steps'])} measured steps per run"
    )


def baseline(d: pd.DataFrame, base: pd.Series | None, base_ms: float) -> str:
    if base is not None:
        return (
            f"The compute-only step (forward, backward, AdamW on one process with the per-rank "
            f"batch, no communication) takes {fmt(base_ms)} ms."
        )
    if is_suspect_run(d, "baseline"):
        return (
            "The compute-only baseline failed a sanity check (see Suspect numbers): no ratio "
            "to it is given."
        )
    return "The compute-only baseline did not run."


def q23(naive: pd.Series, base: pd.Series | None, base_ms: float) -> str:
    """Naive DDP: its step, the share spent communicating, against the compute-only step."""
    return (
        f"Naive DDP (one blocking all-reduce per parameter tensor, "
        f"{int(naive.num_grad_tensors)} calls for {fmt(naive.grad_mb)} MiB of gradients): "
        f"{fmt(naive.step_ms_mean)} ms per step, of which {fmt(naive.comm_ms_mean)} ms "
        f"({pct(naive.comm_share)}) is spent communicating gradients"
        + (
            f"; {fmt(naive.step_ms_mean / base_ms)}× the compute-only step."
            if base is not None
            else "."
        )
    )


def q24(naive: pd.Series, flat: pd.Series) -> str:
    """One all-reduce of the flattened gradients against one per tensor: the measured times
    (the why, from the calls and bytes per step, is `flat_vs_naive`)."""
    ratio = naive.comm_ms_mean / flat.comm_ms_mean
    noise = float(max(naive.comm_ms_std, flat.comm_ms_std))
    gap = float(naive.comm_ms_mean - flat.comm_ms_mean)
    if abs(gap) <= noise:
        verdict = f"the same within the runs' std of {fmt(noise)} ms"
    elif ratio > 1:
        verdict = f"{fmt(ratio)}× less communication time"
    else:
        verdict = f"{fmt(1 / ratio)}× naive's communication time"
    return (
        f"One all-reduce of the flattened gradients: {fmt(flat.step_ms_mean)} ms per step and "
        f"{fmt(flat.comm_ms_mean)} ms communicating, against {fmt(naive.step_ms_mean)} ms and "
        f"{fmt(naive.comm_ms_mean)} ms naive ({verdict})."
    )


def flat_vs_naive(naive: pd.Series, flat: pd.Series, fit: dict | None) -> str:
    """Why flat is (or is not) faster than naive, from the calls and bytes of a step and the
    all-reduce stage's fit at the same backend and world size: the per-call costs flat saves,
    (calls − 1)·o, against the bandwidth term s/w both pay; flagged where there is no fit that
    can be quoted."""
    calls, mib = int(naive.num_grad_tensors), float(naive.grad_mb)
    head = (
        f"Per step both move the same {fmt(mib)} MiB of gradients, naive in {calls} calls and "
        f"flat in one plus a copy into and out of one buffer."
    )
    if fit is None or fit.get("problem"):
        why = f" (its fit is rejected: {fit['problem']})" if fit else ""
        return head + (
            " Flagged: the per-call and bandwidth terms cannot be told apart here, for want of "
            f"an all-reduce fit that can be quoted at this backend and world size{why}."
        )
    saved_ms = (calls - 1) * fit["o"] * 1e3
    band_ms = mib * MiB / fit["w"] * 1e3
    # naive's predicted time: `calls` all-reduces of t = o + bytes/w over the same bytes
    share = pct(saved_ms / (calls * fit["o"] * 1e3 + band_ms))
    gap = float(naive.comm_ms_mean - flat.comm_ms_mean)
    noise = float(max(naive.comm_ms_std, flat.comm_ms_std))
    text = head + (
        f" With the all-reduce stage's fit (o = {fmt(fit['o'] * 1e6)} µs per call, w = "
        f"{fmt(fit['w'] / 1e9)} GB/s), the {calls - 1} calls flat saves cost (n − 1)·o = "
        f"{fmt(saved_ms)} ms, against a bandwidth term s/w = {fmt(band_ms)} ms both pay "
        f"(the saving is {share} of naive's predicted time, n·o + s/w); measured, "
        f"{'naive' if gap >= 0 else 'flat'} communicates {fmt(abs(gap))} ms longer (std up to "
        f"{fmt(noise)} ms)."
    )
    if saved_ms <= 0.1 * band_ms:
        return text + (
            " The communication is bound by its bytes, not its calls: what flat saves is a "
            "tenth of the bandwidth term or less, so flat equals naive."
        )
    if saved_ms <= noise:
        return text + (
            f" The predicted saving is within the runs' std: these steps cannot tell flat from "
            f"naive, and cannot confirm or refute a saving of {share} of naive's predicted "
            "time; more measured steps would."
        )
    if gap < saved_ms - noise:
        return text + (
            f" {fmt(saved_ms - gap)} ms of the predicted saving does not show. No measurement "
            "here says where it goes: likely flat's copies of the gradients into the flat "
            "buffer and back, which its communication time includes (not timed apart) and the "
            "fit leaves out, and large messages reaching the fit's bandwidth per call, whatever "
            "their number."
        )
    if gap > saved_ms + noise:
        return text + (
            f" The measured saving is {fmt(gap - saved_ms)} ms more than the per-call costs flat "
            "no longer pays, beyond the std: more than the fit's per-call cost accounts for here."
        )
    return (
        text
        + " The measured saving matches the per-call costs flat no longer pays (within the std)."
    )


def _step_against(overlap: pd.Series, refs: list[tuple[str, pd.Series]]) -> str:
    """Overlap's step against each run in `refs` (name, row) beside the larger of the two step
    stds: faster, slower or the same; where it is faster than none, that it did not help."""
    parts, helped = [], False
    for name, r in refs:
        gap = float(r.step_ms_mean - overlap.step_ms_mean)
        noise = float(max(r.step_ms_std, overlap.step_ms_std))
        helped = helped or gap > noise
        parts.append(
            f"as fast as {name} within the step std of {fmt(noise)} ms"
            if abs(gap) <= noise
            else f"{fmt(abs(gap))} ms {'faster' if gap > 0 else 'slower'} than {name} "
            f"(step std up to {fmt(noise)} ms)"
        )
    return ("" if helped else "overlapping did not help here, ") + _and(parts)


def _left_after(overlap: pd.Series, refs: list[tuple[str, pd.Series]]) -> str:
    """The communication left after backward, against the runs in `refs`, whose communication
    all comes after backward; 'only' where it is under half of the least of theirs."""
    left = float(overlap.comm_ms_mean)
    text = f"{fmt(left)} ms of communication is left after backward"
    if not refs:
        return text
    small = left < 0.5 * min(float(r.comm_ms_mean) for _, r in refs)
    theirs = _and(f"{name}'s {fmt(r.comm_ms_mean)} ms" for name, r in refs)
    return ("only " if small else "") + f"{text}, against {theirs}"


def _fwd_bwd_slowdown(overlap: pd.Series, base: pd.Series) -> str:
    """Overlap's forward+backward against the compute-only one: a cause (the all-reduces
    competing for the hardware) only where it is slower by more than the larger std."""
    gap = float(overlap.fwd_bwd_ms_mean - base.fwd_bwd_ms_mean)
    stds = [float(r.get("fwd_bwd_ms_std", math.nan)) for r in (overlap, base)]
    noise = max((x for x in stds if not math.isnan(x)), default=math.nan)
    text = (
        f" Forward+backward itself takes {fmt(overlap.fwd_bwd_ms_mean)} ms against "
        f"{fmt(base.fwd_bwd_ms_mean)} ms without communication"
    )
    if math.isnan(noise):
        return text + f" ({fmt(gap)} ms apart; no std recorded to weigh it against)."
    if gap > noise:
        hw = "SMs and memory bandwidth" if overlap.backend == "nccl" else "CPU cores"
        return text + (
            f", {fmt(gap)} ms longer, beyond the std (up to {fmt(noise)} ms): the all-reduces "
            f"launched during backward compete with it for {hw}."
        )
    return text + (
        f": the two are within the steps' spread (std up to {fmt(noise)} ms), so no slowdown shows."
    )


def q25(d: pd.DataFrame, overlap: pd.Series, base: pd.Series | None) -> str:
    """Overlap with backward: its step against naive and flat, what is left after backward,
    what communication slows down in backward, and the profiled overlap."""
    refs = [(v, r) for v in ("naive", "flat") if (r := one(d, v)) is not None]
    ref = ", ".join(f"{name} {fmt(r.step_ms_mean)} ms" for name, r in refs)
    note = inner(sum(is_suspect_run(d, v) for v in ("naive", "flat")))
    ref = "; ".join(x for x in (ref, note) if x)
    verdict = f": {_step_against(overlap, refs)};" if refs else ";"
    text = (
        f"Overlapping each gradient's all-reduce with the rest of backward: "
        f"{fmt(overlap.step_ms_mean)} ms per step{f' ({ref})' if ref else ''}{verdict} "
        f"{_left_after(overlap, refs)}."
    )
    if base is not None:
        text += _fwd_bwd_slowdown(overlap, base)
    share = overlap.get("prof_overlap_share", math.nan)
    if isinstance(share, float) and not math.isnan(share):
        text += (
            f" In the profiled step {pct(share)} of the NCCL kernel time "
            f"({fmt(overlap.prof_comm_kernel_ms)} ms) ran while compute kernels ran."
        )
    return text


def fit_lines(fits: dict[str, dict], d: pd.DataFrame) -> list[str]:
    """One line per latency-bandwidth fit; the naive-flat pair's absence where a run of it is
    suspect."""
    lines = [
        f"{name}: o = {fmt(f['o'] * 1e6, 1)} µs per call, w = {fmt(f['w'] / 1e9)} GB/s"
        + sanity.excluded(f.get("suspect", 0))
        + (f" ⚠ rejected, not used: {f['problem']}" if f.get("problem") else "")
        for name, f in fits.items()
    ]
    n_pair = sum(is_suspect_run(d, v) for v in ("naive", "flat"))
    if n_pair and all(one(d, v) is not None or is_suspect_run(d, v) for v in ("naive", "flat")):
        lines.append(f"naive vs flat DDP runs: not fitted{sanity.excluded(n_pair)}")
    return lines


def best_bucket(best: pd.Series, base: pd.Series | None, base_ms: float, n_out: int) -> str:
    """The fastest bucketed run that passed the checks."""
    return (
        f"The fastest measured bucket size{sanity.excluded(n_out)} is "
        f"{fmt(best.bucket_size_mb)} MiB "
        f"({fmt(best.step_ms_mean)} ms per step"
        + (
            f", {fmt(best.step_ms_mean / base_ms)}× the compute-only step)."
            if base is not None
            else ")."
        )
    )


def model_best(best: pd.Series, fit: dict, fit_name: str) -> str:
    """Where the overhead model puts the optimal bucket size, with the fit's o and w."""
    s = float(best.grad_mb) * MiB
    opt = optimal_bucket(s, fit["w"], fit["o"])
    return (
        f"With s = {fmt(best.grad_mb)} MiB of gradients and the {fit_name} fit, the model "
        f"puts the optimum at n_b* = sqrt(s/(w·o)) = {fmt(opt['n_b'], 1)} buckets, a "
        f"bucket size of b* = sqrt(s·w·o) = {fmt(opt['bucket_mb'])} MiB, with "
        f"{fmt(opt['overhead_ms'])} ms of overhead"
        + (
            "; since n_b* < 1, one bucket holding every gradient is the best the model "
            "allows: the per-call cost outweighs what overlap can hide."
            if opt["n_b"] < 1
            else "."
        )
    )


def model_error(good: pd.DataFrame, backend: str, n_out: int) -> str:
    """How far the model's step is from the measured one over the bucket table's runs that
    passed the checks (`good`), and what the model leaves out."""
    err = (good["model step (ms)"] - good["step (ms)"]) / good["step (ms)"]
    slowed = (
        "concurrent communication kernels"
        if backend == "nccl"
        else "the communication running on the same CPU cores"
    )
    return (
        f"Across the measured bucket sizes{sanity.excluded(n_out)} the model's step "
        f"time is off by {pct(float(err.abs().mean()))} on average (largest "
        f"{pct(float(err.abs().max()))}); it ignores the compute slowed down by "
        f"{slowed}, the copies into and out of the bucket buffers, and that real "
        f"buckets are not equal and backward does not produce gradients at a "
        f"constant rate."
    )


def peer_sentence(d: pd.DataFrame) -> str:
    """PyTorch's DDP beside per-parameter overlap and the fastest bucketed run (runs that passed
    the checks), or '' where either side is missing."""
    good = ok(d)
    peer = good[good["variant"] == "torch_ddp"]
    if not len(peer):
        return ""
    p = peer.iloc[0]
    ours = good[good["variant"].isin(["overlap", "bucketed"])]
    if not len(ours):
        return ""
    best = ours.loc[ours["step_ms_mean"].idxmin()]
    name = (
        f"bucketed {best.bucket_size_mb:g} MiB"
        if best.variant == "bucketed"
        else "overlap (per parameter)"
    )
    ratio = float(best.step_ms_mean) / float(p.step_ms_mean)
    return (
        f"The peer, PyTorch's DistributedDataParallel ({BUCKET_MB:g} MiB buckets), takes "
        f"{fmt(float(p.step_ms_mean))} ± {fmt(float(p.step_ms_std))} ms a step; our fastest, "
        f"{name}, {fmt(float(best.step_ms_mean))} ± {fmt(float(best.step_ms_std))} ms "
        f"({fmt(ratio)}× the peer's time)."
    )


def _and(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _span_ms(values: pd.Series) -> str:
    lo, hi = float(values.min()), float(values.max())
    return f"{fmt(lo)} ms" if fmt(lo) == fmt(hi) else f"{fmt(lo)}–{fmt(hi)} ms"


def bucket_vs_overlap(d: pd.DataFrame) -> list[str]:
    """The bucketed runs against each other and against per-parameter overlap (runs that passed
    the checks): their step times' spread, each gap to overlap beside the step std, the sync
    left after backward, and apart the bucket sizes with one tensor per bucket, as overlap."""
    good = ok(d)
    b = good[good["variant"] == "bucketed"].sort_values("bucket_size_mb")
    o = one(d, "overlap")
    out: list[str] = []
    if len(b) == 0:
        return out
    sizes = ", ".join(f"{x:g}" for x in b["bucket_size_mb"])
    if len(b) > 1:
        spread = float(b["step_ms_mean"].max() - b["step_ms_mean"].min())
        out.append(
            f"The {len(b)} bucket sizes ({sizes} MiB) take {_span_ms(b['step_ms_mean'])} per "
            f"step, within {fmt(spread)} ms of each other (step std {_span_ms(b['step_ms_std'])})."
        )
    if o is None:
        return out
    gap = b["step_ms_mean"] - o.step_ms_mean
    noise = float(max(b["step_ms_std"].max(), o.step_ms_std))
    lo, hi = float(gap.min()), float(gap.max())
    every = "Every bucket size is" if len(b) > 1 else f"The {sizes} MiB run is"
    overlap = f"per-parameter overlap ({fmt(o.step_ms_mean)} ms)"
    if lo > 0:
        text = f"{every} slower than {overlap}, by {_span_ms(gap)}"
    elif hi < 0:
        text = f"{every} faster than {overlap}, by {_span_ms(-gap)}"
    else:
        text = (
            f"Against {overlap} the bucket sizes range from {fmt(-lo)} ms faster to "
            f"{fmt(hi)} ms slower"
        )
    beyond = (
        "every gap larger than the step std of either run"
        if float(gap.abs().min()) > noise
        else "not every gap larger than the runs' step std"
    )
    out.append(f"{text} ({beyond}, at most {fmt(noise)} ms).")
    left = ", ".join(
        f"{x:g} MiB {fmt(c)} ms"
        for x, c in zip(b["bucket_size_mb"], b["comm_ms_mean"], strict=True)
    )
    out.append(f"Sync left after backward: {left}, against {fmt(o.comm_ms_mean)} ms for overlap.")
    single = b[b["num_buckets"] == b["num_grad_tensors"]]
    if len(single):
        n = int(single["num_buckets"].iloc[0])
        extra = single["comm_ms_mean"] - o.comm_ms_mean
        text = (
            f"With {_and(f'{x:g}' for x in single['bucket_size_mb'])} MiB buckets each bucket holds "
            f"one gradient tensor ({n} buckets for {n} tensors), the same {n} all-reduces "
            f"overlap sends, yet {_and(fmt(x) for x in single['comm_ms_mean'])} ms are left after "
            f"backward against {fmt(o.comm_ms_mean)} ms"
        )
        if (extra > 0).all():
            text += (
                f": {_and(fmt(x) for x in extra)} ms more, "
                f"{_and(fmt(x / n * 1e3) for x in extra)} µs per bucket, spent after backward "
                "on what the bucketed wrapper does there per bucket (it waits for the bucket's "
                "all-reduce and copies the result back into the gradients; overlap only waits)"
            )
        out.append(text + ".")
    return out


def _peaks(u: pd.Series, s: pd.Series, reset: bool) -> str:
    """The three memory points, unsharded against sharded: after init, just before and just
    after the optimizer step; with `reset`, each peak counts from the previous point."""
    saved = u.mem_before_step_allocated_mb - s.mem_before_step_allocated_mb
    text = (
        f"Allocated after model and optimizer init: {fmt(u.mem_init_allocated_mb)} MiB "
        f"unsharded vs {fmt(s.mem_init_allocated_mb)} MiB sharded (AdamW allocates its state at "
        f"its first step, so init costs the same); just before the optimizer step "
        f"{fmt(u.mem_before_step_allocated_mb)} vs {fmt(s.mem_before_step_allocated_mb)} MiB "
        f"({fmt(saved)} MiB saved, the optimizer state one rank no longer holds); just after it "
        f"{fmt(u.mem_after_step_allocated_mb)} vs {fmt(s.mem_after_step_allocated_mb)} MiB."
    )
    if not reset:
        return text + (
            f" Peaks: {fmt(u.mem_after_step_peak_mb)} vs {fmt(s.mem_after_step_peak_mb)} MiB, "
            "counted from the job's start by one counter (these rows predate its reset between "
            "the points), so the peaks before and after the step are one number and are not "
            "compared."
        )
    fb, step = u.mem_before_step_peak_mb, u.mem_after_step_peak_mb
    why = (
        "the optimizer step's temporaries on top of the whole state outweigh the activations"
        if step > fb
        else "the activations outweigh what the optimizer step adds"
    )
    return text + (
        f" Peaks, the counter reset at each point: forward+backward {fmt(fb)} vs "
        f"{fmt(s.mem_before_step_peak_mb)} MiB, the optimizer step itself {fmt(step)} vs "
        f"{fmt(s.mem_after_step_peak_mb)} MiB; unsharded, the optimizer step's peak is "
        f"{'above' if step > fb else 'below'} forward+backward's ({why})."
    )


def sharding(u: pd.Series, s: pd.Series, measured_peaks: bool, reset: bool) -> dict[str, str]:
    """The unsharded (`u`) against the sharded (`s`) run: the optimizer state each rank holds
    (`state`), the three memory points where measured (`peaks`; `reset`: each peak counts from
    the previous point) and the time per step (`time`)."""
    n = int(s.world_size)
    ratio = float(s.optimizer_state_mb / u.optimizer_state_mb)
    # off an even split by more than 1%: parameters are assigned to ranks whole
    uneven = (
        f"; an even split over {n} ranks would be {fmt(1 / n)}× — parameters are assigned "
        f"whole, so the largest tensors limit the balance"
        if abs(ratio * n - 1) > 0.01
        else f", an even split over {n} ranks"
    )
    out = {
        "state": (
            f"The optimizer state held per rank falls from {fmt(u.optimizer_state_mb)} MiB to "
            f"{fmt(s.optimizer_state_mb)} MiB ({fmt(ratio)}×{uneven})."
        )
    }
    if measured_peaks:
        out["peaks"] = _peaks(u, s, reset)
    out["time"] = (
        f"Time per step: {fmt(u.step_ms_mean)} ms unsharded vs {fmt(s.step_ms_mean)} ms "
        f"sharded; the optimizer step itself {fmt(u.opt_ms_mean)} vs {fmt(s.opt_ms_mean)} ms "
        f"(the sharded step updates 1/{n} of the parameters, then broadcasts every parameter "
        f"from its owner)."
    )
    return out
