"""PyTorch side of bench/models_bench.cc: the same training steps on the same card, with
PyTorch's best eager settings where memgrad has the feature.

ResNet-50 (torchvision), B=64, 3x224x224; GPT-2 124M (a nanoGPT-style module written here,
tied head, vocab 50304), B=8, T=1024. Each step: zero_grad, forward, loss, backward,
SGD(momentum 0.9, fused=True: memgrad's SGD is fused too), or --optimizer adamw (fused
AdamW, lr 1e-3, weight decay 0.1; config suffix " AdamW" as bench_models prints it). Rows (config strings as
bench_models prints them, so the suite pairs them):
  f32        TF32 off everywhere (matmul and cuDNN), like memgrad's default
  f32 TF32   TF32 on for matmuls and convolutions (bench_models --tf32)
  bf16 autocast, and for ResNet-50 also with channels_last (PyTorch's best eager layout)
  f16 autocast channels_last (ResNet-50; no GradScaler, as bench_models --dtype f16)
--compile runs the rows through torch.compile (side "pytorch_compile").
--cuda-graph captures the whole step (forward, backward, fused SGD) with torch.cuda.graph after
warm-up on a side stream, PyTorch's whole-network capture recipe (side "pytorch_graph", config
suffix " CUDA graph" as bench_models --cuda-graph prints it); with --compile too, the compiled
step captured the same way (side "pytorch_compile_graph").
Prints one JSON line per row.
    python3 bench/pytorch/models_step.py [--rows all|bf16|channels_last] [--model all|resnet50|gpt2-124M|mobilenet|mlp] [--compile]
                                         [--cuda-graph] [--steps N] [--warmup N] [--checkpoint]
                                         [--max-batch-under GIB] [--resid-dropout P]
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.utils.checkpoint
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
        self.drop = nn.Dropout(SIZES["resid_dropout"])  # after each c_proj (--resid-dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, vocab=50304, T=1024, L=12, H=12, d=768):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(T, d)
        self.h = nn.ModuleList([Block(d, H) for _ in range(L)])
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    checkpoint = False  # every block under torch.utils.checkpoint (--checkpoint)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            if self.checkpoint:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
            else:
                x = b(x)
        return self.lm_head(self.ln_f(x))


def make_optimizer(params, name, capturable=False):
    """SGD(momentum 0.9) or AdamW (lr 1e-3, weight decay 0.1), fused like memgrad's (--optimizer).
    capturable: AdamW for a captured step (--cuda-graph), as bench_models sets it."""
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, fused=True, capturable=capturable)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9, fused=True)


def sgd(params):
    """The SGD every other PyTorch step script (amp_step.py, recompute_step.py) uses."""
    return make_optimizer(params, "sgd")


def measure(step, warmup=3, steps=10):
    """CUDA-event step times after warm-up: the median and extremes (ms), peak memory (GiB)."""
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
    return {"step_ms": round(times[len(times) // 2], 3), "step_ms_min": round(times[0], 3),
            "step_ms_max": round(times[-1], 3), "n_runs": len(times),
            "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3)}


def measure_graphed(step, opt, warmup=3, steps=10):
    """measure() of a step captured whole with torch.cuda.graph: warm-up on a side stream (at least
    one step, so optimizer state exists before capture), one captured call, timed replays."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(max(1, warmup)):
            step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        step()
    return measure(g.replay, 2, steps)


def print_row(**fields):
    """One JSON result line (the suite reads them), PyTorch's version first."""
    print(json.dumps({"framework": f"pytorch {torch.__version__}", **fields}), flush=True)


def ratio(a, b, key, digits):
    """a[key] / b[key], rounded: a measurement against the same run's baseline."""
    return round(a[key] / b[key], digits)


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


# --batch / --seq (0: each model's default), as bench_models takes them.
SIZES = {"batch": 0, "seq": 1024, "resid_dropout": 0.0}


def batch_or(default):
    return SIZES["batch"] or default


def resnet50(channels_last):
    import torchvision
    B = batch_or(64)
    m = torchvision.models.resnet50().cuda().train()
    x = torch.randn(B, 3, 224, 224, device="cuda")
    if channels_last:
        m, x = m.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (B,), device="cuda")
    return m, lambda model: F.cross_entropy(model(x), y)


class MobileNetV1(nn.Module):
    """memgrad's nn::MobileNet (v1, width 1.0): a 3x3 stride-2 stem, then 13 depthwise-separable
    blocks (depthwise 3x3 + BN + ReLU, pointwise 1x1 + BN + ReLU), average pool, linear.
    torchvision has no v1, so it is written here, layer for layer."""
    CFG = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1), (512, 1), (512, 1),
           (512, 1), (512, 1), (1024, 2), (1024, 1)]

    def __init__(self, num_classes=1000):
        super().__init__()
        layers = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True)]
        c = 32
        for out, stride in self.CFG:
            layers += [nn.Conv2d(c, c, 3, stride, 1, groups=c, bias=False), nn.BatchNorm2d(c), nn.ReLU(inplace=True),
                       nn.Conv2d(c, out, 1, bias=False), nn.BatchNorm2d(out), nn.ReLU(inplace=True)]
            c = out
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(c, num_classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.features(x), 1), 1))


def mobilenet(channels_last):
    B = batch_or(64)
    m = MobileNetV1().cuda().train()
    x = torch.randn(B, 3, 224, 224, device="cuda")
    if channels_last:
        m, x = m.to(memory_format=torch.channels_last), x.to(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (B,), device="cuda")
    return m, lambda model: F.cross_entropy(model(x), y)


def gpt2(channels_last):
    m = GPT().cuda().train()
    m.checkpoint = SIZES.get("checkpoint", False)
    B, T = batch_or(8), SIZES["seq"]
    idx = torch.randint(0, 50304, (B, T), device="cuda")
    tgt = torch.randint(0, 50304, (B, T), device="cuda")
    return m, lambda model: F.cross_entropy(model(idx).view(-1, 50304), tgt.view(-1))


def mlp(channels_last):
    m = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10)).cuda()
    x = torch.randn(batch_or(64), 784, device="cuda")
    y = torch.randint(0, 10, (batch_or(64),), device="cuda")
    return m, lambda model: F.cross_entropy(model(x), y)


MODELS = {"mlp": (lambda: f"784-256-128-10 B={batch_or(64)}", mlp),
          "resnet50": (lambda: f"B={batch_or(64)} 224x224", resnet50),
          "mobilenet": (lambda: f"B={batch_or(64)} 224x224", mobilenet),
          "gpt2-124M": (lambda: f"B={batch_or(8)} T={SIZES['seq']}", gpt2)}
# What one step consumes, for samples_per_s (images, or tokens for GPT-2).
SAMPLES = {"mlp": (lambda: batch_or(64), "images"), "resnet50": (lambda: batch_or(64), "images"),
           "mobilenet": (lambda: batch_or(64), "images"),
           "gpt2-124M": (lambda: batch_or(8) * SIZES["seq"], "tokens")}
# (precision tag as bench_models prints it, TF32, autocast dtype, channels_last, models)
# mlp and mobilenet only when named (--model mlp / mobilenet), as bench_models runs them.
ROWS = [("f32", False, None, False, ("mlp", "resnet50", "mobilenet", "gpt2-124M")),
        ("f32 TF32", True, None, False, ("resnet50", "mobilenet", "gpt2-124M")),
        ("bf16 autocast", False, torch.bfloat16, False, ("resnet50", "mobilenet", "gpt2-124M")),
        ("bf16 autocast channels_last", False, torch.bfloat16, True, ("resnet50", "mobilenet")),
        ("f16 autocast channels_last", False, torch.float16, True, ("resnet50", "mobilenet"))]


def train_step(fwd, loss_of, opt, dtype):
    """One training step of a row: forward under autocast to dtype (none for f32), backward, step."""
    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
            loss = loss_of(fwd)
        loss.backward()
        opt.step()
    return step


def run_row(model, tag, tf32, dtype, channels_last, compiled, a):
    config, make = MODELS[model]
    set_tf32(tf32)
    torch.manual_seed(0)
    m, loss_of = make(channels_last)
    opt = make_optimizer(m.parameters(), a.optimizer, capturable=a.cuda_graph)
    if a.optimizer == "adamw":
        tag += " AdamW"
    if a.checkpoint and model == "gpt2-124M":
        tag += " checkpoint"
    if compiled and a.memory_budget is not None:
        tag += f" memory budget {a.memory_budget:g}"
    fwd = torch.compile(m) if compiled else m
    step = train_step(fwd, loss_of, opt, dtype)
    side = "pytorch_compile" if compiled else "pytorch_eager"
    if a.cuda_graph:
        r = measure_graphed(step, opt, a.warmup, a.steps)
        side, tag = ("pytorch_compile_graph" if compiled else "pytorch_graph"), tag + " CUDA graph"
    else:
        r = measure(step, a.warmup, a.steps)
    n, unit = SAMPLES[model]
    rd = SIZES["resid_dropout"] if model == "gpt2-124M" else 0
    print_row(model=model, config=f"{config()} {tag}" + (f" resid-dropout {rd:g}" if rd > 0 else ""), side=side, **r,
              samples_per_s=round(n() / (r["step_ms"] / 1000.0)), sample_unit=unit)
    del m, opt, fwd
    torch.cuda.empty_cache()


def max_batch_under(gib, tag, dtype, a, model="gpt2-124M", channels_last=False):
    """The largest batch whose whole step (forward, backward, optimizer step) fits under a
    per-process cap of `gib` GiB (set_per_process_memory_fraction), by doubling then bisection
    over torch.OutOfMemoryError: bench_models --max-batch-under's search, on PyTorch's side.
    GPT-2 (T = --seq, --checkpoint for every block) or ResNet-50 (224x224, channels_last when the
    row says so)."""
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(gib * 2**30 / total)
    torch.manual_seed(0)
    gpt = model == "gpt2-124M"
    if gpt:
        m = GPT().cuda().train()
        m.checkpoint = a.checkpoint
    else:
        import torchvision
        m = torchvision.models.resnet50().cuda().train()
        if channels_last:
            m = m.to(memory_format=torch.channels_last)
    opt = make_optimizer(m.parameters(), a.optimizer)
    # dynamic=True: one graph with a symbolic batch, not a recompile per batch size the search tries.
    fwd = torch.compile(m, dynamic=True) if a.compile else m
    T = SIZES["seq"]

    def loss_at(b):
        if gpt:
            idx = torch.randint(0, 50304, (b, T), device="cuda")
            tgt = torch.randint(0, 50304, (b, T), device="cuda")
            return F.cross_entropy(fwd(idx).view(-1, 50304), tgt.view(-1))
        x = torch.randn(b, 3, 224, 224, device="cuda")
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        return F.cross_entropy(fwd(x), torch.randint(0, 1000, (b,), device="cuda"))

    def fits(b):
        try:
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=dtype or torch.float16, enabled=dtype is not None):
                loss = loss_at(b)
            loss.backward()
            opt.step()
            torch.cuda.synchronize()
            ok = True
        except torch.OutOfMemoryError:
            ok = False
        loss = None
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
        tries.append([b, ok])
        return ok
    tries, lo, hi, b = [], 0, 0, 1
    while True:
        if not fits(b):
            hi = b
            break
        lo, b = b, b * 2
    while lo and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    torch.cuda.set_per_process_memory_fraction(1.0)
    tag += (" AdamW" if a.optimizer == "adamw" else "") + (" checkpoint" if a.checkpoint and gpt else "")
    shape = f"T={T}" if gpt else "224x224"
    print_row(model=model, config=f"{shape} {tag} max batch under {gib:g} GiB",
              side="pytorch_compile" if a.compile else "pytorch_eager", max_batch=lo, tries=tries)
    del m, opt, fwd
    torch.cuda.empty_cache()


def row_wanted(rows, dtype, channels_last):
    if rows == "bf16":
        return dtype is torch.bfloat16
    if rows == "channels_last":
        return channels_last
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", default="all", choices=["all", "bf16", "channels_last"],
                    help="bf16: the bf16 autocast rows; channels_last: ResNet-50's channels_last rows (bf16, f16)")
    ap.add_argument("--model", default="all", choices=["all", *MODELS])
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cuda-graph", action="store_true")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=0)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--resid-dropout", type=float, default=0.0,
                    help="GPT-2: nn.Dropout(P) after each block's c_proj and MLP projection (bench_models' flag)")
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adamw"])
    ap.add_argument("--checkpoint", action="store_true", help="GPT-2: every block checkpointed")
    ap.add_argument("--memory-budget", type=float, default=None,
                    help="with --compile: torch._functorch.config.activation_memory_budget (the min-cut "
                         "partitioner's recomputation budget, 1.0 = keep everything)")
    ap.add_argument("--max-batch-under", type=float, default=0,
                    help="GiB: the largest batch under this cap (GPT-2 and ResNet-50), for each --rows precision")
    a = ap.parse_args()
    SIZES.update(batch=a.batch, seq=a.seq, checkpoint=a.checkpoint, resid_dropout=a.resid_dropout)
    if a.memory_budget is not None:
        import torch._functorch.config
        torch._functorch.config.activation_memory_budget = a.memory_budget
    if a.max_batch_under > 0:
        for tag, tf32, dtype, channels_last, models in ROWS:
            if not row_wanted(a.rows, dtype, channels_last):
                continue
            for model in models:
                if model not in ("mlp", "mobilenet") and a.model in (model, "all") or a.model == model == "mobilenet":
                    set_tf32(tf32)
                    max_batch_under(a.max_batch_under, tag, dtype, a, model, channels_last)
        return
    for tag, tf32, dtype, channels_last, models in ROWS:
        if not row_wanted(a.rows, dtype, channels_last):
            continue
        for model in models:
            if a.model == model or (a.model == "all" and model not in ("mlp", "mobilenet")):
                run_row(model, tag, tf32, dtype, channels_last, a.compile, a)


if __name__ == "__main__":
    main()
