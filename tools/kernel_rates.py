"""Kernel rates on one CUDA GPU at the per-GPU shapes of lab 11's held-out rows.

    python tools/kernel_rates.py          # writes $OUT/kernels.json (or /tmp/out/kernels.json)

Needs a CUDA GPU and a torch with fp8 (`torch._scaled_mm`); CI has neither, so it is not part of
`pytest`. It times, with CUDA events (ten calls after three warm-ups): bf16 and fp8 tensorwise
GEMMs, torch's causal SDPA forward and forward + backward, eager and compiled elementwise ops
(RMSNorm, an add, SwiGLU, torchtitan's RoPE), and a device-to-device copy. Its output on an H200
is `src/paralab/scale/KERNELS.toml`, which tests/test_scale.py sets against the model's constants.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

DEVICE = "cuda"
HBM_DATASHEET = 4.8e12
"""H200's HBM3e, bytes a second: the rate the elementwise timings are read against."""

GEMMS = {
    "8b q/o": (16384, 4096, 4096),  # Llama 3.1 8B, FSDP 8, local batch 2 x 8192 tokens a GPU
    "8b k/v": (16384, 4096, 1024),
    "8b w1/w3": (16384, 4096, 14336),
    "8b w2": (16384, 14336, 4096),
    "70b tp8 q": (131072, 8192, 1024),  # 70B, TP 8 under SP, local batch 16 x 8192 tokens
    "70b tp8 w1": (131072, 8192, 3584),
    "70b tp8 w2": (131072, 3584, 8192),
    "8b tp8 w1": (98304, 4096, 1792),  # 8B, TP 8, local batch 12 x 8192 tokens
    "8b tp8 q": (98304, 4096, 512),
    "qwen3 expert": (4096, 2048, 1536),  # Qwen3-30B-A3B, one expert's w1 and w3, 4096 tokens
    "qwen3 expert w2": (4096, 768, 2048),
}
ATTENTION = {  # batch, heads, tokens; head dim 128, causal
    "8b causal": (2, 32, 8192),
    "70b tp8 causal": (16, 8, 8192),
    "ring block": (1, 32, 8192),
}


def seconds(fn: Callable[[], object], warm: int = 3, reps: int = 10) -> float:
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps / 1e3


def gemm_rates(m: int, k: int, n: int) -> dict[str, float]:
    a = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=DEVICE, dtype=torch.bfloat16)
    flops = 2 * m * k * n
    out = {"bf16_tflops": flops / seconds(lambda: a @ b) / 1e12}
    a8 = a.to(torch.float8_e4m3fn)
    b8 = b.t().contiguous().to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm wants
    one = torch.tensor(1.0, device=DEVICE)

    def fp8() -> torch.Tensor:
        return torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

    out["fp8_tensorwise_tflops"] = flops / seconds(fp8) / 1e12
    return out


def attention_seconds(batch: int, heads: int, tokens: int) -> dict[str, float]:
    shape = (batch, heads, tokens, 128)
    q, k, v = (
        torch.randn(shape, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )
    grad = torch.randn(shape, device=DEVICE, dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    with torch.no_grad():
        fwd = seconds(forward)
    return {"fwd_s": fwd, "fwd_bwd_s": seconds(lambda: forward().backward(grad))}


def elementwise_rates() -> dict[str, object]:
    n, h, f = 16384, 4096, 14336
    x, y = (torch.randn(n, h, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    a, c = (torch.randn(n, f, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    xq = torch.randn(2, 8192, 32, 128, device=DEVICE, dtype=torch.bfloat16)
    freqs = torch.polar(torch.ones(8192, 64, device=DEVICE), torch.randn(8192, 64, device=DEVICE))
    norm = torch.nn.RMSNorm(h, device=DEVICE, dtype=torch.bfloat16)

    def swiglu(u: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.silu(u) * w

    def rope() -> torch.Tensor:  # torchtitan's apply_rotary_emb on q
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        return torch.view_as_real(xq_ * freqs.view(1, 8192, 1, 64)).flatten(3).type_as(xq)

    compiled_norm, compiled_swiglu = torch.compile(norm), torch.compile(swiglu)
    ops = {
        "rmsnorm eager fwd": (lambda: norm(x), n * h),
        "add eager": (lambda: x + y, n * h),
        "swiglu eager fwd": (lambda: swiglu(a, c), n * f),
        "rope eager fwd (q)": (rope, xq.numel()),
        "rmsnorm compiled fwd": (lambda: compiled_norm(x), n * h),
        "swiglu compiled fwd": (lambda: compiled_swiglu(a, c), n * f),
    }
    out: dict[str, object] = {}
    with torch.no_grad():
        for name, (fn, elements) in ops.items():
            t = seconds(fn)
            out[name] = {"s": t, "bytes_per_elem_at_4.8TBs": t * HBM_DATASHEET / elements}
    big = torch.empty(2 * 1024**3, device=DEVICE, dtype=torch.uint8)
    dst = torch.empty_like(big)
    out["copy TB/s (read+write)"] = 2 * big.numel() / seconds(lambda: dst.copy_(big)) / 1e12
    return out


def main() -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "gemm": {f"{name} {'x'.join(map(str, s))}": gemm_rates(*s) for name, s in GEMMS.items()},
        "attention": {
            f"{name} {'x'.join(map(str, s))}": attention_seconds(*s)
            for name, s in ATTENTION.items()
        },
        "elementwise": elementwise_rates(),
    }
    folder = os.environ.get("OUT", "/tmp/out")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "kernels.json"), "w") as fh:
        json.dump(result, fh, indent=1)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
