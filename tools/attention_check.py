"""Drives tools/attention_check.cu (the tensor-core attention kernels as a .so) from PyTorch on
the device: outputs, logsumexp and gradients against a float64 reference on the same rounded
inputs, determinism of the backward, then timings next to F.scaled_dot_product_attention.

  nvcc -std=c++20 -O3 -arch=sm_90 -shared -Xcompiler -fPIC -I. tools/attention_check.cu -o /tmp/attn_tc.so
  python3 tools/attention_check.py /tmp/attn_tc.so [--no-timing] [--no-check] [--strided-only]

--strided-only runs just the packed-QKV checks (q/k/v as strided views of [B, T, 3C], y and the
gradient written in place) and times them against contiguous inputs and the old copies.
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

lib.tc_forward_strided.argtypes = lib.tc_forward.argtypes[:-1] + [P, P]
lib.tc_backward_strided.argtypes = lib.tc_backward.argtypes[:-1] + [P, P]


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


def layouts(*ts):
    """TcLayout {H, sb, sh, sp} of [B, H, n, D] views, packed for the strided entry points."""
    flat = []
    for t in ts:
        assert t.stride(3) == 1
        flat += [t.shape[1], t.stride(0), t.stride(1), t.stride(2)]
    return torch.tensor(flat, dtype=torch.int64)


def split_heads(x, i, H):
    """Part i of a packed [B, T, 3C] tensor as a [B, H, T, D] view (no copy)."""
    B, T, C3 = x.shape
    C = C3 // 3
    return x[..., i * C:(i + 1) * C].view(B, T, H, C // H).transpose(1, 2)


def tc_packed(qkv, dy, H, causal, scale):
    """Forward + backward straight from qkv [B, T, 3C]: y [B, T, C], grad [B, T, 3C], no copies."""
    B, T, C3 = qkv.shape
    C, D = C3 // 3, C3 // 3 // H
    q, k, v = (split_heads(qkv, i, H) for i in range(3))
    y = torch.empty(B, T, C, device=qkv.device, dtype=qkv.dtype)
    yh = y.view(B, T, H, D).transpose(1, 2)
    lse = torch.empty(B * H, T, device=qkv.device, dtype=torch.float32)
    bf = int(qkv.dtype == torch.bfloat16)
    lay = layouts(q, k, v, yh)
    e = lib.tc_forward_strided(bf, ptr(q), ptr(k), ptr(v), ptr(yh), ptr(lse), B * H, T, T, D, scale, int(causal),
                               P(lay.data_ptr()), stream())
    assert e == 0, f"tc_forward_strided: cuda error {e}"
    dyh = dy.view(B, T, H, D).transpose(1, 2)
    delta = (dyh.float() * yh.float()).sum(-1).reshape(B * H, T).contiguous()
    g = torch.empty_like(qkv)
    gq, gk, gv = (split_heads(g, i, H) for i in range(3))
    lay = layouts(q, k, v, dyh, gq, gk, gv)
    e = lib.tc_backward_strided(bf, ptr(q), ptr(k), ptr(v), ptr(dyh), ptr(lse), ptr(delta), ptr(gq), ptr(gk),
                                ptr(gv), B * H, T, T, D, scale, int(causal), P(lay.data_ptr()), stream())
    assert e == 0, f"tc_backward_strided: cuda error {e}"
    return y, lse, g


def check_strided():
    """q/k/v read in place from [B, T, 3C], y and the [B, T, 3C] gradient written in place, vs float64."""
    failures = 0
    g = torch.Generator(device="cuda").manual_seed(4321)
    for dtype in (torch.float16, torch.bfloat16):
        tol, gtol = 2e-2, (6e-2 if dtype == torch.bfloat16 else 2e-2)
        for B, T, H, D in [(2, 77, 3, 64), (1, 130, 2, 128), (2, 1, 2, 64), (2, 300, 4, 64), (1, 257, 3, 128)]:
            for causal in (False, True):
                C, scale = H * D, 1.0 / math.sqrt(D)
                qkv = (torch.rand(B, T, 3 * C, device="cuda", generator=g) * 4 - 2).to(dtype)
                dy = (torch.rand(B, T, C, device="cuda", generator=g) * 4 - 2).to(dtype)
                y, lse, gqkv = tc_packed(qkv, dy, H, causal, scale)
                y2, _, g2 = tc_packed(qkv, dy, H, causal, scale)
                q, k, v = (split_heads(qkv, i, H) for i in range(3))
                dyh = dy.view(B, T, H, D).transpose(1, 2)
                rout, rlse, rdq, rdk, rdv = reference(q, k, v, dyh, causal, scale)
                rg = torch.cat([t.transpose(1, 2).reshape(B, T, C) for t in (rdq, rdk, rdv)], -1)
                errs = {"out": worst(rout.transpose(1, 2).reshape(B, T, C), y),
                        "lse": worst(rlse.reshape(B * H, T), lse), "grad": worst(rg, gqkv)}
                deterministic = torch.equal(y, y2) and torch.equal(gqkv, g2)
                ok = errs["out"] <= tol and errs["lse"] <= 1e-4 and errs["grad"] <= gtol and deterministic
                failures += not ok
                print(("ok  " if ok else "FAIL"), "packed", str(dtype).split(".")[-1], f"B={B} T={T} H={H} D={D}",
                      "causal" if causal else "full", " ".join(f"{k_}={v_:.2e}" for k_, v_ in errs.items()),
                      "" if deterministic else "NONDETERMINISTIC", flush=True)
    print(f"# check_strided: {failures} failures", flush=True)
    return failures


def timing_strided():
    """Packed (strided, in place) vs contiguous [BH, T, D] inputs, same kernels, GPT-2 124M shape."""
    B, H, T, D = 8, 12, 1024, 64
    for dtype in (torch.bfloat16,):
        for causal in (True, False):
            scale = 1.0 / math.sqrt(D)
            qkv = torch.randn(B, T, 3 * H * D, device="cuda", dtype=dtype)
            dy = torch.randn(B, T, H * D, device="cuda", dtype=dtype)
            q, k, v = (split_heads(qkv, i, H).reshape(B * H, T, D).contiguous() for i in range(3))
            dout = dy.view(B, T, H, D).transpose(1, 2).reshape(B * H, T, D).contiguous()

            def contiguous():
                o, l = tc_forward(q, k, v, causal, scale)
                tc_backward(dout, q, k, v, o, l, causal, scale)

            def copies():  # what the unpacked path did: split copies, merge copy, grad concat
                qc, kc, vc = (split_heads(qkv, i, H).contiguous().view(B * H, T, D) for i in range(3))
                o, l = tc_forward(qc, kc, vc, causal, scale)
                o.view(B, H, T, D).transpose(1, 2).reshape(B, T, H * D)
                d = dy.view(B, T, H, D).transpose(1, 2).contiguous().view(B * H, T, D)
                gs = tc_backward(d, qc, kc, vc, o, l, causal, scale)
                torch.cat([t.view(B, H, T, D).transpose(1, 2).reshape(B, T, H * D) for t in gs], -1)

            tp = attention_sdpa.median_ms(lambda: tc_packed(qkv, dy, H, causal, scale))
            tc = attention_sdpa.median_ms(contiguous)
            tcp = attention_sdpa.median_ms(copies)
            print(json.dumps({"B": B, "H": H, "T": T, "D": D, "dtype": str(dtype).split(".")[-1], "causal": causal,
                              "packed_fwd_bwd_ms": round(tp, 4), "contiguous_fwd_bwd_ms": round(tc, 4),
                              "with_copies_fwd_bwd_ms": round(tcp, 4), "packed_vs_contiguous": round(tp / tc, 3),
                              "packed_vs_with_copies": round(tp / tcp, 3)}), flush=True)


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
    if "--strided-only" in sys.argv:
        fails = check_strided()
        if "--no-timing" not in sys.argv:
            timing_strided()
        sys.exit(1 if fails else 0)
    fails = 0 if "--no-check" in sys.argv else check() + check_strided()
    if "--no-timing" not in sys.argv:
        timing()
        timing_strided()
    sys.exit(1 if fails else 0)
