"""PyTorch's optimizer step time on the parameter lists bench/optim_bench.cc uses, for comparison:
torch.optim.Adam/AdamW/SGD with foreach=False (per parameter), foreach=True and fused=True.

    python bench/pytorch/optim_step.py [--steps 20]     (last line: JSON)
"""
import argparse
import json
import time

import torch


def make_params(layers, d, device):
    torch.manual_seed(0)
    ps = []
    for _ in range(layers):
        for s in [(d, d), (4 * d, d), (d, 4 * d), (3 * d, d), (d,), (d,), (4 * d,), (d,), (3 * d,)]:
            p = torch.nn.Parameter(torch.randn(*s, device=device))
            p.grad = torch.randn(*s, device=device)
            ps.append(p)
    return ps


def ms_per_step(make, layers, d, device, steps):
    ps = make_params(layers, d, device)
    opt = make(ps)
    for _ in range(3):
        opt.step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        opt.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1000 / steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    device = "cuda"
    opts = {
        "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=1e-3, **kw),
        "adamw": lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-3, **kw),
        "sgd_momentum": lambda ps, **kw: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, **kw),
    }
    sizes = [("gpt2_blocks_12x768", 12, 768), ("tiny_48x64", 48, 64)]
    rows = []
    for name, make in opts.items():
        for sname, layers, d in sizes:
            row = {"optimizer": name, "size": sname, "tensors": 9 * layers}
            for mode, kw in [("per_param", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})]:
                row[mode + "_ms"] = ms_per_step(lambda ps: make(ps, **kw), layers, d, device, args.steps)
            row["fused_speedup"] = row["per_param_ms"] / row["fused_ms"]
            print(f"torch {name:13s} {sname:20s} per-param {row['per_param_ms']:8.3f} ms  foreach "
                  f"{row['foreach_ms']:8.3f} ms  fused {row['fused_ms']:8.3f} ms  speedup {row['fused_speedup']:6.2f}x")
            rows.append(row)
    print(json.dumps({"bench": "torch_optim", "torch": torch.__version__, "steps": args.steps, "rows": rows}))


if __name__ == "__main__":
    main()
