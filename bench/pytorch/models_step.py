"""PyTorch side of bench/models_bench.cc: the same training steps on the same card.

ResNet-50 (torchvision), B=64, 3x224x224, f32; GPT-2 124M (a nanoGPT-style module written
here, tied head, vocab 50304), B=8, T=1024, f32. Each step: zero_grad, forward, loss,
backward, SGD(momentum 0.9). PyTorch defaults otherwise (cuDNN may use TF32 for convolutions
by default; matmuls do not), and a second ResNet run with TF32 off everywhere.
Prints one JSON line per configuration.
"""
import json
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.ln_2 = nn.LayerNorm(d)
        self.c_fc = nn.Linear(d, 4 * d)
        self.mlp_proj = nn.Linear(4 * d, d)
        self.h = h

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50304, T=1024, L=12, H=12, d=768):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(T, d)
        self.h = nn.ModuleList([Block(d, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        return self.lm_head(self.ln_f(x))


def measure(step, warmup=3, steps=10):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], torch.cuda.max_memory_allocated() / 2**30, torch.cuda.max_memory_reserved() / 2**30


def report(model, config, r):
    print(json.dumps({"framework": f"pytorch {torch.__version__}", "model": model, "config": config,
                      "step_ms": round(r[0], 2), "peak_allocated_gib": round(r[1], 3),
                      "peak_reserved_gib": round(r[2], 3)}), flush=True)


def main():
    which = sys.argv[1] if len(sys.argv) > 1 else "all"
    dev = "cuda"
    torch.manual_seed(0)
    if which in ("all", "resnet50"):
        import torchvision
        for tf32 in (True, False):
            torch.backends.cudnn.allow_tf32 = tf32
            m = torchvision.models.resnet50().to(dev).train()
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            x = torch.randn(64, 3, 224, 224, device=dev)
            y = torch.randint(0, 1000, (64,), device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(m(x), y).backward()
                opt.step()
            report("resnet50", "B=64 224x224 f32" + (" (cuDNN TF32 default on)" if tf32 else " (TF32 off)"), measure(step))
            del m, opt
            torch.cuda.empty_cache()
        torch.backends.cudnn.allow_tf32 = True
    if which in ("all", "gpt2"):
        for sdpa in ("flash/efficient (default)", "math"):
            m = GPT().to(dev).train()
            opt = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)
            idx = torch.randint(0, 50304, (8, 1024), device=dev)
            tgt = torch.randint(0, 50304, (8, 1024), device=dev)

            def step():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(m(idx).view(-1, 50304), tgt.view(-1)).backward()
                opt.step()
            if sdpa == "math":
                from torch.nn.attention import SDPBackend, sdpa_kernel
                with sdpa_kernel(SDPBackend.MATH):
                    r = measure(step)
            else:
                r = measure(step)
            report("gpt2-124M", f"B=8 T=1024 f32, sdpa {sdpa}", r)
            del m, opt
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
