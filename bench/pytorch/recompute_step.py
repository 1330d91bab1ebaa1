"""PyTorch side of bench/recompute_bench.cc: the same GPT-2-small training step on the same card.

12 layers, d=768, 12 heads, T=1024, B=8, vocab 50304, tied head, SGD(momentum 0.9), flash
attention (F.scaled_dot_product_attention), in f32 and in bf16 autocast. Modes:
  none        plain
  per-block   torch.utils.checkpoint(block, use_reentrant=False) around every block
  selective   eager selective activation checkpointing: per-block checkpoint with a policy that
              saves matmul and attention outputs
              (torch.utils.checkpoint.create_selective_checkpoint_contexts) and recomputes
              everything else (norms, GELU, adds) - PyTorch's closest analogue of memgrad's
              selective recomputation, labelled as what it is in the "implementation" field
Every checkpoint keeps preserve_rng_state=True, as memgrad's recomputation does
(autograd/recompute.h). SGD is fused=True, like memgrad's.
Prints one JSON line per (dtype, mode) with the median step time, the peak allocated bytes and
the ratios against "none" in the same run.
    python3 bench/pytorch/recompute_step.py [--dtype f32|bf16|all] [--steps 10]
"""
import argparse
import functools
import os
import sys

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models_step  # noqa: E402  (the model and timing of bench/pytorch/models_step.py)
from models_step import measure, print_row, ratio, sgd  # noqa: E402

PRESERVE_RNG_STATE = True  # memgrad's RecomputeOptions::preserve_rng_state default
IMPLEMENTATION = {
    "none": "eager, no checkpointing",
    "per-block": "eager torch.utils.checkpoint per block (use_reentrant=False, preserve_rng_state=True)",
    "selective": "eager selective activation checkpointing per block (SAC policy: save mm/attention, "
                 "recompute the rest; preserve_rng_state=True)",
}

try:
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts
except ImportError:  # older PyTorch: no selective checkpointing
    create_selective_checkpoint_contexts = None


def _save_matmuls_and_attention():
    names = ["mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"]
    keep = {getattr(torch.ops.aten, n).default for n in names if hasattr(torch.ops.aten, n)}

    def policy(ctx, op, *args, **kwargs):
        return CheckpointPolicy.MUST_SAVE if op in keep else CheckpointPolicy.PREFER_RECOMPUTE
    return policy


class GPT(models_step.GPT):
    """models_step's GPT with a checkpointing mode for its blocks."""

    def __init__(self):
        super().__init__()
        self.mode = "none"

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            if self.mode == "per-block":
                x = checkpoint(b, x, use_reentrant=False, preserve_rng_state=PRESERVE_RNG_STATE)
            elif self.mode == "selective":
                ctx = functools.partial(create_selective_checkpoint_contexts, _save_matmuls_and_attention())
                x = checkpoint(b, x, use_reentrant=False, context_fn=ctx, preserve_rng_state=PRESERVE_RNG_STATE)
            else:
                x = b(x)
        return self.lm_head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dtype", default="all", choices=["f32", "bf16", "all"])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    dev = "cuda"
    torch.manual_seed(0)
    m = GPT().to(dev).train()
    opt = sgd(m.parameters())
    idx = torch.randint(0, 50304, (8, 1024), device=dev)
    tgt = torch.randint(0, 50304, (8, 1024), device=dev)
    modes = ["none", "per-block"] + (["selective"] if create_selective_checkpoint_contexts else [])
    for dtype in (["f32", "bf16"] if args.dtype == "all" else [args.dtype]):
        base = None
        for mode in modes:
            m.mode = mode

            def step():
                opt.zero_grad(set_to_none=True)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == "bf16"):
                    loss = F.cross_entropy(m(idx).view(-1, 50304), tgt.view(-1))
                loss.backward()
                opt.step()
            torch.cuda.empty_cache()
            r = measure(step, args.warmup, args.steps)
            if base is None:
                base = r
            print_row(model="gpt2", config=f"L=12 d=768 H=12 B=8 T=1024 {dtype} SGD(momentum)", mode=mode,
                      implementation=IMPLEMENTATION[mode], **r, time_vs_none=ratio(r, base, "step_ms", 3),
                      peak_vs_none=ratio(r, base, "peak_allocated_gib", 3))


if __name__ == "__main__":
    main()
