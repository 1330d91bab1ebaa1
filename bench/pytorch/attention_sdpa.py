"""PyTorch side of bench/attention_bench.cc: F.scaled_dot_product_attention forward and
forward+backward at the same shapes (q, k, v [B, H, T, D], f16/bf16, causal or not).

PyTorch picks its backend (flash attention on an H200 for these shapes); the backend it used
is printed. Times are CUDA-event medians over `iters` runs after warm-up, no host sync inside.
Prints one JSON line per configuration.
"""
import json
import sys

import torch
import torch.nn.functional as F

from models_step import measure

SHAPES = [  # (B, H, T, D): GPT-2 124M's attention, a longer sequence, a 128 head dim
    (8, 12, 1024, 64),
    (4, 12, 2048, 64),
    (8, 8, 1024, 128),
]


def median_ms(fn, iters=20, warmup=3):
    return measure(fn, warmup=warmup, steps=iters)[0]  # models_step's CUDA-event median


def attention_flops(B, H, T, D, causal, backward):
    # 2 products forward (q k^T, p v), 5 backward (FlashAttention's count); causal does half.
    f = 4.0 * B * H * T * T * D * (3.5 if backward else 1.0)
    return f / 2 if causal else f


def sdpa_inputs(B, H, T, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, T, D, device="cuda", dtype=dtype, generator=g).requires_grad_(True) for _ in range(3)]


def time_sdpa(B, H, T, D, dtype, causal):
    q, k, v = sdpa_inputs(B, H, T, D, dtype)
    dout = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)

    return median_ms(fwd), median_ms(fwd_bwd)


def sdpa_backend(q, k, v, causal):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "attention" in e.name.lower() or "fmha" in e.name.lower()]
    return names[0] if names else "unknown"


def main():
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    for B, H, T, D in SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (True, False):
                fwd, fb = time_sdpa(B, H, T, D, dtype, causal)
                q, k, v = sdpa_inputs(B, H, T, D, dtype)
                print(json.dumps({
                    "bench": "torch_sdpa", "B": B, "H": H, "T": T, "D": D, "dtype": str(dtype).split(".")[-1],
                    "causal": causal, "fwd_ms": round(fwd, 4), "fwd_bwd_ms": round(fb, 4),
                    "fwd_tflops": round(attention_flops(B, H, T, D, causal, False) / fwd / 1e9, 1),
                    "fwd_bwd_tflops": round(attention_flops(B, H, T, D, causal, True) / fb / 1e9, 1),
                    "kernel": sdpa_backend(q, k, v, causal)}), flush=True)


if __name__ == "__main__":
    main()
