"""PyTorch's layer norm weight gradient in f32 on CUDA against f64, at a GPT-2 block's size.

The counterpart of FusedTransformer.LayerNormWeightGradientAtGptSizeIsNearF64 (memgrad's fused
backward): h of 8192 x 768 from N(0, 1) halves added, weight U(0.5, 1.5), bias and the output's
gradient N(0, 1); the normwise error ||dw - dw64|| / ||dw64|| over several seeds.
"""
import json

import torch


def one(seed):
    g = torch.Generator().manual_seed(seed)
    m, n = 8192, 768
    h = torch.randn(m, n, generator=g) + torch.randn(m, n, generator=g)
    w = torch.rand(n, generator=g) + 0.5
    b = torch.randn(n, generator=g)
    gy = torch.randn(m, n, generator=g)
    grads = {}
    for dt in (torch.float32, torch.float64):
        hh = h.to("cuda", dt)
        ww = w.to("cuda", dt).requires_grad_()
        bb = b.to("cuda", dt).requires_grad_()
        y = torch.nn.functional.layer_norm(hh, (n,), ww, bb, 1e-5)
        y.backward(gy.to("cuda", dt))
        grads[dt] = ww.grad.double()
    d = grads[torch.float32] - grads[torch.float64]
    return (d.norm() / grads[torch.float64].norm()).item()


errs = sorted(one(s) for s in range(5))
print(json.dumps({"framework": "pytorch", "what": "layer_norm dweight 8192x768 f32 vs f64, normwise",
                  "median": errs[len(errs) // 2], "min": errs[0], "max": errs[-1]}))
