"""PyTorch side of bench/amp_bench.cc: the same mixed-precision training steps on the same card.

Models: the main job's MLP (784-256-128-10, B=64), a wide MLP (784-4096x3-10, B=1024),
ResNet-50 (torchvision, B=64, 3x224x224) and GPT-2 124M (bench/pytorch/models_step.py's
module, B=8, T=1024). Precisions: f32, f16 (torch.autocast + torch.amp.GradScaler) and bf16
(torch.autocast, no scaler), eager mode, and "pure bf16": the model stored in bf16
(model.to(torch.bfloat16), bf16 momentum, round-to-nearest updates) under bf16 autocast. Each step: zero_grad(set_to_none), forward + loss
under autocast, scaler.scale(loss).backward(), scaler.step(SGD momentum 0.9, fused=True like
memgrad's), scaler.update().
Prints one JSON line per (model, precision) with the ratios to f32 from the same run.
--cuda-graph: the whole step captured with torch.cuda.graph after the warm-up on a side stream
and timed as replays (fused SGD takes GradScaler's scale and overflow flag on the device); pure
bf16 is left out there, as in memgrad's bench_amp --cuda-graph.
Usage: python bench/pytorch/amp_step.py [--model mlp|mlp-wide|resnet50|gpt2|all] [--steps N] [--warmup N]
       [--cuda-graph]
"""
import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models_step import GPT, measure, measure_graphed, print_row, ratio, sgd  # noqa: E402


def mlp(widths, batch, dev):
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU(inplace=True))
    m = nn.Sequential(*layers).to(dev)
    x = torch.randn(batch, widths[0], device=dev)
    y = torch.randint(0, widths[-1], (batch,), device=dev)
    return m, lambda: F.cross_entropy(m(x), y)


def resnet50(dev):
    import torchvision
    m = torchvision.models.resnet50().to(dev)
    x = torch.randn(64, 3, 224, 224, device=dev)
    y = torch.randint(0, 1000, (64,), device=dev)
    return m, lambda: F.cross_entropy(m(x), y)


def gpt2(dev):
    m = GPT().to(dev)
    idx = torch.randint(0, 50304, (8, 1024), device=dev)
    tgt = torch.randint(0, 50304, (8, 1024), device=dev)
    return m, lambda: F.cross_entropy(m(idx).view(-1, 50304), tgt.view(-1))


MODELS = {
    "mlp": ("784-256-128-10 B=64", lambda d: mlp([784, 256, 128, 10], 64, d)),
    "mlp-wide": ("784-4096x3-10 B=1024", lambda d: mlp([784, 4096, 4096, 4096, 10], 1024, d)),
    "resnet50": ("B=64 224x224", resnet50),
    "gpt2": ("B=8 T=1024", gpt2),
}


def run(make, precision, dev, warmup, steps, graph=False):
    torch.manual_seed(0)
    m, loss_fn = make(dev)
    if precision == "pure-bf16":
        m.to(torch.bfloat16)
    m.train()
    opt = sgd(m.parameters())
    amp = precision != "f32"
    dtype = torch.bfloat16 if precision in ("bf16", "pure-bf16") else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "f16")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype, enabled=amp):
            loss = loss_fn()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    r = measure_graphed(step, opt, warmup, steps) if graph else measure(step, warmup, steps)
    del m, opt
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="all", choices=["all", *MODELS])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--cuda-graph", action="store_true")
    a = ap.parse_args()
    dev = "cuda"
    names = {"f32": "f32", "f16": "f16 autocast+GradScaler", "bf16": "bf16 autocast",
             "pure-bf16": "pure bf16 (bf16 momentum, round-to-nearest)"}
    for name, (config, make) in MODELS.items():
        if a.model not in ("all", name):
            continue
        base = None
        for precision in ("f32", "f16", "bf16") + (() if a.cuda_graph else ("pure-bf16",)):
            torch.cuda.empty_cache()
            try:
                r = run(make, precision, dev, a.warmup, a.steps, a.cuda_graph)
            except RuntimeError as e:  # what torch.cuda.graph cannot capture, said as a row
                print_row(model=name, config=config, precision=names[precision], cuda_graph=a.cuda_graph,
                          error=str(e).splitlines()[0][:200])
                continue
            if base is None:
                base = r
            print_row(model=name, config=config, precision=names[precision], cuda_graph=a.cuda_graph, **r,
                      speedup_vs_f32=ratio(base, r, "step_ms", 2),
                      memory_vs_f32=ratio(r, base, "peak_allocated_gib", 2))


if __name__ == "__main__":
    main()
