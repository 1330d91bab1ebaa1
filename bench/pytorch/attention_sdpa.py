"""PyTorch side of bench/attention_bench.cc: F.scaled_dot_product_attention forward and
forward+backward at the same shapes (q, k, v [B, H, T, D], f16/bf16, f32 with TF32, causal or not).

PyTorch picks its backend (flash attention on an H200 for these shapes); the backend it used
is printed. Times are CUDA-event medians over `iters` runs after warm-up, no host sync inside.
Prints one JSON line per configuration and pass, keyed like attention_bench's records.
    python3 bench/pytorch/attention_sdpa.py [--shapes 0,1,2] [--dtypes bf16,f16,f32-tf32] [--causal 1,0]
"""
import argparse
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


def timed(fn, iters=20, warmup=3):
    """models_step's CUDA-event timing, as the ms / ms_min / ms_max keys attention_bench reports."""
    r = measure(fn, warmup=warmup, steps=iters)
    return {"ms": r["step_ms"], "ms_min": r["step_ms_min"], "ms_max": r["step_ms_max"], "n_runs": r["n_runs"]}


def attention_flops(B, H, T, D, causal, backward):
    # 2 products forward (q k^T, p v), 5 backward (FlashAttention's count); causal does half.
    f = 4.0 * B * H * T * T * D * (3.5 if backward else 1.0)
    return f / 2 if causal else f


def sdpa_inputs(B, H, T, D, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(B, H, T, D, device="cuda", dtype=dtype, generator=g).requires_grad_(True) for _ in range(3)]


def time_sdpa(B, H, T, D, dtype, causal):
    """{"fwd": timing, "fwd+bwd": timing}."""
    q, k, v = sdpa_inputs(B, H, T, D, dtype)
    dout = torch.randn_like(q)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.autograd.grad(out, (q, k, v), dout)

    return {"fwd": timed(fwd), "fwd+bwd": timed(fwd_bwd)}


def sdpa_backend(q, k, v, causal):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if "attention" in e.name.lower() or "fmha" in e.name.lower()]
    return names[0] if names else "unknown"


# "f32-tf32": f32 with TF32 allowed for matmuls, attention_bench's f32 row with
# set_allow_tf32(true); "f32": the same without TF32. PyTorch runs both on its memory-efficient
# (CUTLASS) kernel, fmha_cutlassF_f32, whatever the TF32 flag says.
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32-tf32": torch.float32, "f32": torch.float32}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="0,1,2", help="indices into SHAPES")
    ap.add_argument("--dtypes", default="bf16,f16")
    ap.add_argument("--causal", default="1,0")
    a = ap.parse_args()
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}", file=sys.stderr)
    for B, H, T, D in [SHAPES[int(i)] for i in a.shapes.split(",")]:
        for name in a.dtypes.split(","):
            torch.backends.cuda.matmul.allow_tf32 = name == "f32-tf32"
            for causal in (c == "1" for c in a.causal.split(",")):
                times = time_sdpa(B, H, T, D, DTYPES[name], causal)
                kernel = sdpa_backend(*sdpa_inputs(B, H, T, D, DTYPES[name]), causal)
                for pass_name, t in times.items():
                    # The configuration string attention_bench's labels carry (the suite pairs them).
                    config = f"B{B} H{H} T{T} D{D} {name} {'causal' if causal else 'full'} {pass_name}"
                    tflops = attention_flops(B, H, T, D, causal, pass_name != "fwd") / t["ms"] / 1e9
                    print(json.dumps({"benchmark": "Attention", "config": config, **t, "TFLOP/s": round(tflops, 1),
                                      "kernel": kernel}), flush=True)


if __name__ == "__main__":
    main()
