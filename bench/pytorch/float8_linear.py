"""A float8 linear layer for PyTorch's side of the FP8 comparison (docs/mixed_precision.md), built
on torch._scaled_mm, as torchao's float8 training does with its default recipe (tensorwise
dynamic scaling): the input and the weight cast to e4m3 and the output gradient to e5m2, each
scaled by its own amax (current scaling, memgrad's Fp8Scaling::Current); the forward GEMM with
fast accumulation, the two gradient GEMMs without; the operands transposed as the FP8 GEMM's
layout asks (the second operand column-major). torchao itself is not installed on the device and
cannot be fetched there, so this stands in for it: it is not torchao, and its numbers are named
as this module's.

    from float8_linear import swap_linears
    swap_linears(model.h)            # every nn.Linear inside the blocks; the head stays
    model = torch.compile(model)     # the casts and transposes fuse into the compiled graph

`python3 bench/pytorch/float8_linear.py` checks the layer against the bf16 linear on random data
(output and gradients within a few e4m3/e5m2 steps, normwise) and prints the errors.
"""
import torch
import torch.nn as nn

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def to_fp8(t, dtype):
    """t's codes in `dtype` with its tensorwise scale (largest |t| at the format's largest finite
    value), and the inverse scale _scaled_mm multiplies the product by."""
    fmax = torch.finfo(dtype).max
    amax = t.abs().amax().float().clamp(min=1e-12)
    scale = fmax / amax
    q = (t.float() * scale).clamp(-fmax, fmax).to(dtype).contiguous()
    return q, scale.reciprocal()


class _Float8Matmul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, out_dtype):
        # x [M, K] (f32 or bf16), w [N, K] (the f32 parameter, cast here directly).
        xq, x_inv = to_fp8(x, E4M3)
        wq, w_inv = to_fp8(w, E4M3)
        out = torch._scaled_mm(xq, wq.t(), scale_a=x_inv, scale_b=w_inv, out_dtype=out_dtype, use_fast_accum=True)
        ctx.save_for_backward(xq, x_inv, wq, w_inv)
        ctx.x_dtype, ctx.w_dtype = x.dtype, w.dtype
        return out

    @staticmethod
    def backward(ctx, g):
        xq, x_inv, wq, w_inv = ctx.saved_tensors
        gq, g_inv = to_fp8(g, E5M2)
        # dx [M, K] = g [M, N] @ w [N, K]: w column-major.
        gx = torch._scaled_mm(gq, wq.t().contiguous().t(), scale_a=g_inv, scale_b=w_inv, out_dtype=ctx.x_dtype)
        # dw [N, K] = g^T [N, M] @ x [M, K]: g^T row-major, x column-major; in the weight's dtype.
        gw = torch._scaled_mm(gq.t().contiguous(), xq.t().contiguous().t(), scale_a=g_inv, scale_b=x_inv,
                              out_dtype=ctx.w_dtype)
        return gx, gw, None


class Float8Linear(nn.Module):
    """nn.Linear's parameters, its GEMMs in float8; the output in bf16 (autocast's dtype)."""

    def __init__(self, linear):
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x):
        shape = x.shape
        out = _Float8Matmul.apply(x.reshape(-1, shape[-1]), self.weight, torch.bfloat16)
        if self.bias is not None:
            out = out + self.bias.to(out.dtype)
        return out.view(*shape[:-1], out.shape[-1])


def swap_linears(module):
    """Every nn.Linear under `module` replaced by a Float8Linear holding the same parameters."""
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Float8Linear(child))
        else:
            swap_linears(child)
    return module


def check():
    torch.manual_seed(0)
    M, K, N = 512, 1600, 4800
    lin = nn.Linear(K, N).cuda()
    x = torch.randn(M, K, device="cuda", requires_grad=True)
    r = torch.randn(M, N, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = lin(x)
    (ref.float() * r).sum().backward()
    ref_gx, ref_gw = x.grad.clone(), lin.weight.grad.clone()
    x.grad, lin.weight.grad = None, None
    f8 = Float8Linear(lin)
    out = f8(x)
    (out.float() * r).sum().backward()

    def rel(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    errs = {"out": rel(out, ref), "grad_x": rel(x.grad, ref_gx), "grad_w": rel(lin.weight.grad, ref_gw)}
    print("float8_linear normwise error against bf16:", {k: f"{v:.2e}" for k, v in errs.items()})
    # e4m3 rounds by up to 2^-4 relative and e5m2 by 2^-3; on random data the normwise error of a
    # long dot product of rounded operands is a fraction of that.
    assert errs["out"] < 0.0625 and errs["grad_x"] < 0.125 and errs["grad_w"] < 0.125, errs
    assert out.dtype == torch.bfloat16 and x.grad.dtype == x.dtype and lin.weight.grad.dtype == torch.float32


if __name__ == "__main__":
    check()
