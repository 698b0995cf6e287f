"""Which kind of work a GPU kernel (or a CPU operator) does, decided from its name alone.

One function, `classify_kernel`, so the profile stage, its analysis and its tests agree. Classes:

- ``gemm``: matrix multiplies (cuBLAS/cuBLASLt incl. Hopper ``nvjet_*``, cutlass, ``*xmma*``,
  Triton templates, the split-K reduction that belongs to a GEMM; CPU: aten::mm/addmm/bmm...)
- ``attention``: fused attention kernels (FlashAttention, memory-efficient/cuDNN SDPA, ours)
- ``optimizer``: optimizer updates (fused/foreach Adam, ``multi_tensor_apply_kernel``)
- ``reduction``: kernels that reduce along a dimension: softmax, norms, sums/means, losses
- ``elementwise``: pointwise kernels and copies (``vectorized_elementwise_kernel``, Triton
  ``triton_poi_*``, masked_fill, casts, concatenation)
- ``other``: the rest (embedding gathers/scatters, RNG, memsets...)

Softmax counts as a reduction: each row is a max and a sum before the pointwise exp/divide.
"""

from __future__ import annotations

import re
from functools import lru_cache

KERNEL_CLASSES = ("gemm", "attention", "elementwise", "reduction", "optimizer", "other")

# Ordered: the first matching rule wins. Patterns run on the lower-cased full name.
_RULES: list[tuple[str, re.Pattern[str]]] = [
    (
        "optimizer",
        re.compile(r"adam|multi_tensor_apply|_foreach_|\bsgd\b|lamb_|optim::|optimizer"),
    ),
    (
        "attention",
        re.compile(
            r"flash|fmha|sdpa|attention|_attn_|attn_fwd|attn_bwd|scaled_dot_product"
            r"|efficient_attention"
        ),
    ),
    (
        "gemm",
        re.compile(
            r"gemm|xmma|nvjet|cublas|cutlass|gemv|matmul|splitkreduce|triton_tem_fused_\w*mm"
            r"|aten::(?:mm|addmm|bmm|baddbmm|addbmm|linear|_scaled_mm|dot|mv)\b"
        ),
    ),
    # pointwise kernel templates: decide before the keyword rules below, because an
    # elementwise kernel's functor name can mention e.g. `norm` (RNG `normal_kernel`)
    ("elementwise", re.compile(r"elementwise_kernel|triton_poi_|unrolled_elementwise")),
    (
        "reduction",
        re.compile(
            r"reduce_kernel|reduction|softmax|layer_?norm|rms_?norm|batch_?norm|group_?norm"
            r"|welford|nll_loss|cross_entropy|logsumexp|cunn_|triton_(?:per|red)_"
            r"|aten::(?:sum|mean|amax|amin|max|min|norm|var|std|argmax|argmin|prod|cumsum)\b"
        ),
    ),
    (
        "elementwise",
        re.compile(
            r"copy|fill|catarray|cat_|where|masked|silu|gelu|relu|sigmoid|tanh|rsqrt|sqrt"
            r"|\bpow|\bexp\b|\badd|\bmul|\bsub|\bdiv|\bneg|clamp|tril|triu|_to_copy"
            r"|aten::(?:to|add_?|mul_?|sub_?|div_?|neg|exp|pow|rsqrt|sqrt|silu|relu|gelu"
            r"|sigmoid|tanh|masked_fill_?|fill_|zero_|zeros|zeros_like|ones|ones_like|full"
            r"|cat|stack|clone|contiguous|copy_|where|tril|triu|cos|sin|arange|lerp_?"
            r"|addcmul_?|addcdiv_?|maximum|minimum)\b"
        ),
    ),
]


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> str:
    """The class (one of KERNEL_CLASSES) of a CUDA kernel or CPU operator, from its name."""
    low = str(name).lower()
    for label, pattern in _RULES:
        if pattern.search(low):
            return label
    return "other"


def short_kernel_name(name: str, limit: int = 80) -> str:
    """A readable kernel name for tables: no `void `, no template arguments or parameters
    (a generic wrapper such as cutlass's `Kernel2<...>` keeps its first template argument)."""
    text = str(name).strip().replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    if text.startswith("void "):
        text = text[5:]
    cut = min((i for i in (text.find("<"), text.find("(")) if i >= 0), default=len(text))
    base = text[:cut].strip()
    if base.rsplit("::", 1)[-1] in _GENERIC_WRAPPERS and text[cut : cut + 1] == "<":
        depth, arg = 0, []
        for ch in text[cut + 1 :]:
            if ch in "<(":
                depth += 1
            elif ch in ">)":
                if depth == 0:
                    break
                depth -= 1
            elif ch == "," and depth == 0:
                break
            arg.append(ch)
        base = f"{base}<{''.join(arg).strip()}>"
    elif cut < len(text) and text[cut] == "<":
        base += "<…>"
    base = base or text
    return base if len(base) <= limit else base[: limit - 1] + "…"


_GENERIC_WRAPPERS = {"Kernel", "Kernel2", "device_kernel", "kernel", "GenericKernel"}


# pointwise and reduction templates whose first argument says nothing: the op is inside
_OP_WRAPPERS = {
    "elementwise_kernel",
    "vectorized_elementwise_kernel",
    "unrolled_elementwise_kernel",
    "reduce_kernel",
}
_NOISE = re.compile(
    r"\(anonymous namespace\)::|<unnamed>::|\b(?:at::native::|at::cuda::|c10::|std::|"
    r"binary_internal::)|\((?:int|bool|unsigned long|long|unsigned int)\)"
)
_OP_KERNEL = re.compile(r"\b(\w+?)_kernel(?:_cuda|_impl)?\b")
_OP_FUNCTOR = re.compile(r"\b(\w*Functor\w*|\w+Ops)\b")


def kernel_label(name: str, limit: int = 160) -> str:
    """A readable name that keeps different kernels apart, for the report's tables: the
    kernel's own name without namespaces; pointwise and reduction templates name the op they
    run (`vectorized_elementwise_kernel[silu]`, `elementwise_kernel[masked_fill]`,
    `reduce_kernel[MeanOps]`); other templates keep short argument lists
    (`softmax_warp_forward<float, float, float, 10, 0, 0>`). Labels can still coincide for
    kernels that differ in a long argument list: `unique_labels` numbers those."""
    text = str(name).strip()
    if text.startswith("aten::"):  # a CPU operator: its name is already short and unique
        return text if len(text) <= limit else text[: limit - 1] + "…"
    if text.startswith("void "):
        text = text[5:]
    text = _NOISE.sub("", text)
    cut = min((i for i in (text.find("<"), text.find("(")) if i >= 0), default=len(text))
    base = text[:cut].strip().rsplit("::", 1)[-1] or text[:cut].strip()
    rest = text[cut:]
    if base in _OP_WRAPPERS and rest.startswith("<"):
        ops = [m for m in _OP_KERNEL.findall(rest) if m not in ("gpu", "launch")]
        if not ops:
            ops = ["/".join(dict.fromkeys(_OP_FUNCTOR.findall(rest)))]
        op = ops[0] if ops and ops[0] else "…"
        label = f"{base}[{op}]"
    elif base.rsplit("::", 1)[-1] in _GENERIC_WRAPPERS or not rest.startswith("<"):
        label = short_kernel_name(name, limit=limit) if rest.startswith("<") else base
    else:
        depth, args = 0, []
        for ch in rest[1:]:
            if ch == "<":
                depth += 1
            elif ch == ">":
                if depth == 0:
                    break
                depth -= 1
            args.append(ch)
        inner = " ".join("".join(args).split())
        label = f"{base}<{inner}>" if len(inner) <= 40 else f"{base}<…>"
    return label if len(label) <= limit else label[: limit - 1] + "…"


def unique_labels(names) -> dict[str, str]:
    """{full name: label} with a running number on labels that several kernels share."""
    names = list(dict.fromkeys(names))
    labels = {n: kernel_label(n) for n in names}
    count: dict[str, int] = {}
    for label in labels.values():
        count[label] = count.get(label, 0) + 1
    seen: dict[str, int] = {}
    for n in sorted(names):
        label = labels[n]
        if count[label] > 1:
            seen[label] = seen.get(label, 0) + 1
            labels[n] = f"{label} #{seen[label]}"
    return labels


# a GEMM kernel's name says which units run it: cuBLAS/CUTLASS name FFMA (fp32 on the CUDA
# cores) kernels `*ffma*`/`*sgemm*`/`*simt*`, tensor-core kernels by their MMA instruction,
# operand types or Hopper's nvjet/gmma families
_CUDA_CORE = re.compile(r"ffma|sgemm|dgemm|simt|gemv")
_TENSOR_CORE = re.compile(
    r"hmma|imma|gmma|wgmma|tensorop|nvjet|s16816|s1688|h16816|h1688|bf16|f16|tf32|i8816|"
    r"xmma_gemm_(?:bf16|f16|tf32)|_tf32|cudnn"
)


def gemm_unit(name: str) -> str:
    """'tensor cores', 'CUDA cores' or 'unknown' for a GEMM kernel, from its name (a CPU
    operator: 'CPU')."""
    low = str(name).lower()
    if low.startswith("aten::"):
        return "CPU"
    if _CUDA_CORE.search(low):
        return "CUDA cores"
    if _TENSOR_CORE.search(low):
        return "tensor cores"
    return "unknown"


# ---- the operation a kernel runs, over its variants ------------------------------------------

# kernels that run one operation under many names (a template per row length, a register or
# shared-memory variant, a CPU operator): the operation, by a pattern on the lower-cased name
# (the loss's log-softmax before attention's softmax: `aten::_log_softmax`,
# `LogSoftmaxBackward0`, `cunn_SoftMaxForwardSmem<…, LogSoftMaxForwardEpilogue, …>` are the
# cross-entropy over the vocabulary, not attention)
_OPERATION_RULES: list[tuple[str, re.Pattern[str]]] = [
    ("cross-entropy", re.compile(r"nll_loss|cross_entropy|logsumexp|log_?softmax")),
    ("softmax", re.compile(r"softmax")),
    ("norm", re.compile(r"layer_?norm|rms_?norm|batch_?norm|group_?norm|welford")),
    ("masked_fill", re.compile(r"masked_fill")),
    ("copy", re.compile(r"direct_copy|copy_kernel|\bcopy_|_to_copy|catarray|cat_")),
]
_FUNCTOR_OP = re.compile(r"(?:functor_)?(\w+?)(?:functor|ops|_kernel)?$")


def kernel_operation(name: str) -> str:
    """The operation a kernel runs, the same for its variants: `softmax` for
    `softmax_warp_forward<float, float, float, 9, 0, 0>`, `<…, 10, …>` and
    `cunn_SoftMaxForwardReg<…>`; `cross-entropy` for the loss's log-softmax
    (`aten::_log_softmax`, `cunn_SoftMaxForwardSmem<…, LogSoftMaxForwardEpilogue, …>`) and
    its nll_loss; `matmul` for every GEMM; `mul` for the pointwise templates
    that multiply (`vectorized_elementwise_kernel[BUnaryFunctor/MulFunctor]`,
    `elementwise_kernel[BinaryFunctor/MulFunctor]`); `mean` for `reduce_kernel[MeanOps]`; a
    CPU operator its name without `aten::`; any other kernel its name without template
    arguments. A share taken per kernel splits an operation over its variants (each below a
    threshold the operation passes): take it per operation."""
    cls = classify_kernel(name)
    if cls == "gemm":
        return "matmul"
    if cls in ("attention", "optimizer"):
        return {"attention": "fused attention", "optimizer": "optimizer update"}[cls]
    low = str(name).lower()
    for op, pattern in _OPERATION_RULES:
        if pattern.search(low):
            return op
    if low.startswith("aten::"):
        return low.removeprefix("aten::").strip("_")
    label = kernel_label(name)
    if "[" in label and label.endswith("]"):  # a pointwise or reduction template: its op
        inner = label[label.index("[") + 1 : -1].split("/")[-1].lower()
        m = _FUNCTOR_OP.match(inner.removeprefix("cudafunctor_"))
        return (m.group(1) if m else inner) or inner
    return label.split("<", 1)[0]
