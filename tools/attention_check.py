"""Drives tools/attention_check.cu (the tensor-core attention kernels as a .so) from PyTorch on
the device: outputs, logsumexp and gradients against a float64 reference on the same rounded
inputs, determinism of the backward, then timings next to F.scaled_dot_product_attention.

  nvcc -std=c++20 -O3 -arch=sm_90 -shared -Xcompiler -fPIC -I. tools/attention_check.cu -o /tmp/attn_tc.so
  python3 tools/attention_check.py /tmp/attn_tc.so [--no-timing] [--no-check]
"""
import ctypes
import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench", "pytorch"))
import attention_sdpa  # noqa: E402

lib = ctypes.CDLL(sys.argv[1])
P = ctypes.c_void_p
lib.tc_forward.argtypes = [ctypes.c_int, P, P, P, P, P, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                           ctypes.c_int, ctypes.c_float, ctypes.c_int, P]
lib.tc_backward.argtypes = [ctypes.c_int, P, P, P, P, P, P, P, P, P, ctypes.c_int64, ctypes.c_int64,
                            ctypes.c_int64, ctypes.c_int, ctypes.c_float, ctypes.c_int, P]


def ptr(t):
    return P(t.data_ptr())


def stream():
    return P(torch.cuda.current_stream().cuda_stream)


def tc_forward(q, k, v, causal, scale):
    BH, L, D = q.shape
    S = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(BH, L, device=q.device, dtype=torch.float32)
    e = lib.tc_forward(int(q.dtype == torch.bfloat16), ptr(q), ptr(k), ptr(v), ptr(out), ptr(lse), BH, L, S, D,
                       scale, int(causal), stream())
    assert e == 0, f"tc_forward: cuda error {e}"
    return out, lse


def tc_backward(dout, q, k, v, out, lse, causal, scale):
    BH, L, D = q.shape
    S = k.shape[1]
    delta = (dout.float() * out.float()).sum(-1)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    e = lib.tc_backward(int(q.dtype == torch.bfloat16), ptr(q), ptr(k), ptr(v), ptr(dout), ptr(lse), ptr(delta),
                        ptr(dq), ptr(dk), ptr(dv), BH, L, S, D, scale, int(causal), stream())
    assert e == 0, f"tc_backward: cuda error {e}"
    return dq, dk, dv


def reference(q, k, v, dout, causal, scale):
    q, k, v = (t.double().requires_grad_(True) for t in (q, k, v))
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    if causal:
        L, S = s.shape[-2:]
        s = s.masked_fill(torch.ones(L, S, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.matmul(torch.softmax(s, -1), v)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout.double())
    return out.detach(), lse.detach(), dq, dk, dv


def worst(ref, got):
    """max |ref - got| / (|ref| + rms(ref) + 0.01), the test's metric."""
    ref, got = ref.double(), got.double()
    rms = ref.pow(2).mean().sqrt() if ref.numel() else 0
    return float(((ref - got).abs() / (ref.abs() + rms + 0.01)).max()) if ref.numel() else 0.0


def check():
    cases = []
    for D in (64, 128):
        for BH, L, S in [(6, 1, 1), (6, 7, 7), (4, 64, 64), (3, 100, 100), (3, 257, 257), (2, 1024, 1024),
                         (2, 5, 37), (2, 40, 9), (2, 130, 70), (2, 70, 130)]:
            cases.append((BH, L, S, D))
    cases.append((70000, 2, 3, 64))
    failures = 0
    g = torch.Generator(device="cuda").manual_seed(1234)
    for dtype in (torch.float16, torch.bfloat16):
        tol, gtol = 2e-2, (6e-2 if dtype == torch.bfloat16 else 2e-2)
        for BH, L, S, D in cases:
            for causal in (False, True):
                scale = 1.0 / math.sqrt(D)
                q = (torch.rand(BH, L, D, device="cuda", generator=g) * 4 - 2).to(dtype)
                k = (torch.rand(BH, S, D, device="cuda", generator=g) * 4 - 2).to(dtype)
                v = (torch.rand(BH, S, D, device="cuda", generator=g) * 4 - 2).to(dtype)
                dout = (torch.rand(BH, L, D, device="cuda", generator=g) * 4 - 2).to(dtype)
                out, lse = tc_forward(q, k, v, causal, scale)
                dq, dk, dv = tc_backward(dout, q, k, v, out, lse, causal, scale)
                dq2, dk2, dv2 = tc_backward(dout, q, k, v, out, lse, causal, scale)
                rout, rlse, rdq, rdk, rdv = reference(q, k, v, dout, causal, scale)
                errs = {"out": worst(rout, out), "lse": worst(rlse, lse), "dq": worst(rdq, dq),
                        "dk": worst(rdk, dk), "dv": worst(rdv, dv)}
                deterministic = all(torch.equal(a, b) for a, b in ((dq, dq2), (dk, dk2), (dv, dv2)))
                ok = (errs["out"] <= tol and errs["lse"] <= 1e-4 and max(errs["dq"], errs["dk"], errs["dv"]) <= gtol
                      and deterministic)
                failures += not ok
                print(("ok  " if ok else "FAIL"), str(dtype).split(".")[-1], f"BH={BH} L={L} S={S} D={D}",
                      "causal" if causal else "full", " ".join(f"{k_}={v_:.2e}" for k_, v_ in errs.items()),
                      "" if deterministic else "NONDETERMINISTIC", flush=True)
    print(f"# check: {failures} failures", flush=True)
    return failures


def timing():
    for B, H, T, D in attention_sdpa.SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            for causal in (True, False):
                scale = 1.0 / math.sqrt(D)
                q, k, v = (t.detach().reshape(B * H, T, D) for t in attention_sdpa.sdpa_inputs(B, H, T, D, dtype))
                dout = torch.randn_like(q)
                state = {}

                def fwd():
                    state["o"] = tc_forward(q, k, v, causal, scale)

                def fwd_bwd():
                    o, l = tc_forward(q, k, v, causal, scale)
                    tc_backward(dout, q, k, v, o, l, causal, scale)

                tf, tfb = attention_sdpa.median_ms(fwd), attention_sdpa.median_ms(fwd_bwd)
                sf, sfb = attention_sdpa.time_sdpa(B, H, T, D, dtype, causal)
                fl, flb = (attention_sdpa.attention_flops(B, H, T, D, causal, b) for b in (False, True))
                print(json.dumps({"B": B, "H": H, "T": T, "D": D, "dtype": str(dtype).split(".")[-1],
                                  "causal": causal, "tc_fwd_ms": round(tf, 4), "tc_fwd_bwd_ms": round(tfb, 4),
                                  "torch_fwd_ms": round(sf, 4), "torch_fwd_bwd_ms": round(sfb, 4),
                                  "tc_fwd_tflops": round(fl / tf / 1e9, 1), "tc_fwd_bwd_tflops": round(flb / tfb / 1e9, 1),
                                  "fwd_vs_torch": round(tf / sf, 2), "fwd_bwd_vs_torch": round(tfb / sfb, 2)}),
                      flush=True)


if __name__ == "__main__":
    fails = 0 if "--no-check" in sys.argv else check()
    if "--no-timing" not in sys.argv:
        timing()
    sys.exit(1 if fails else 0)
