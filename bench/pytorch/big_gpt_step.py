"""PyTorch's side of the "bigger than the GPU" table (docs/bigger_than_gpu.md): one GPT training
step (bf16 autocast, AdamW, B=8, T=1024 by default) of a named size, under an optional per-process
memory cap, in one of PyTorch's modes:

  eager       the model on the device, fused AdamW
  checkpoint  every block under torch.utils.checkpoint, fused AdamW
  fsdp        FSDP2 (fully_shard per block and the root) at world size 1 with CPUOffloadPolicy:
              parameters, gradients and the optimizer state in host memory, bf16 compute and f32
              reduction (MixedPrecisionPolicy), the AdamW step on the CPU, every block
              checkpointed

--compile wraps the model in torch.compile (eager and checkpoint modes). --float8 runs the blocks'
linear layers in float8 (float8_linear.py: torch._scaled_mm with tensorwise dynamic scaling, as
torchao's default recipe; torchao is not installed on the device). TF32 is off.

Prints one JSON line: step_ms (median, min, max over --steps after --warmup), tokens_per_s, mfu
(llm.c's 6N + 6LdT FLOPs a token against the card's dense bf16 peak, 989 TFLOP/s on H100 and
H200), the peak allocated and reserved GiB, or {"oom": true} when a step does not fit under the
cap.

    python3 bench/pytorch/big_gpt_step.py --gpt gpt2-xl --mode fsdp --cap 16
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models_step import GPT  # noqa: E402  the same GPT-2 module the other rows run

# nn::gpt_preset's shapes (layers, width, heads), at vocabulary 50304 and context 1024.
PRESETS = {"gpt2": (12, 768, 12), "gpt2-medium": (24, 1024, 16), "gpt2-large": (36, 1280, 20),
           "gpt2-xl": (48, 1600, 25), "gpt-2.7b": (32, 2560, 32), "gpt-6.7b": (32, 4096, 32)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt", default="gpt2", choices=list(PRESETS))
    ap.add_argument("--mode", default="eager", choices=["eager", "checkpoint", "fsdp"])
    ap.add_argument("--cap", type=float, default=0, help="GiB: torch.cuda.set_per_process_memory_fraction")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (eager, checkpoint)")
    ap.add_argument("--float8", action="store_true", help="the blocks' linears in float8 (eager, checkpoint)")
    a = ap.parse_args()
    L, d, H = PRESETS[a.gpt]
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if a.cap > 0:
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, a.cap * 2**30 / total))
    config = (f"B={a.batch} T={a.seq} bf16 autocast AdamW {a.mode}" + (" compile" if a.compile else "") +
              (" float8 (torch._scaled_mm, tensorwise)" if a.float8 else "") +
              (f" cap {a.cap:g} GiB" if a.cap > 0 else ""))
    side = f"pytorch_{a.mode}" + ("_compile" if a.compile else "") + ("_float8" if a.float8 else "")
    row = {"framework": "pytorch", "model": a.gpt, "config": config, "side": side}
    torch.manual_seed(0)
    try:
        if a.mode == "fsdp":
            import torch.distributed as dist
            from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29517")
            dist.init_process_group("nccl", rank=0, world_size=1)
            torch.cuda.set_device(0)
            with torch.device("meta"):
                m = GPT(L=L, H=H, d=d)
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for b in m.h:
                fully_shard(b, mp_policy=mp, offload_policy=CPUOffloadPolicy())
            fully_shard(m, mp_policy=mp, offload_policy=CPUOffloadPolicy())
            m.to_empty(device="cpu")
            for p in m.parameters():
                torch.nn.init.normal_(p, std=0.02)
            m.checkpoint = True
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1)  # CPU tensors: foreach
            autocast = False  # MixedPrecisionPolicy casts
        else:
            m = GPT(L=L, H=H, d=d).cuda()
            if a.float8:
                from float8_linear import swap_linears
                swap_linears(m.h)
            m.checkpoint = a.mode == "checkpoint"
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1, fused=True)
            autocast = True
        n_params = sum(p.numel() for p in m.parameters())
        if a.compile:
            m = torch.compile(m)
        m.train()
        idx = torch.randint(0, 50304, (a.batch, a.seq), device="cuda")
        tgt = torch.randint(0, 50304, (a.batch, a.seq), device="cuda")

        def step():
            opt.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
                loss = F.cross_entropy(m(idx).view(-1, 50304).float(), tgt.view(-1))
            loss.backward()
            opt.step()

        for _ in range(a.warmup):
            step()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(a.steps):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - t0) * 1e3)
        med = statistics.median(times)
        row.update(step_ms=round(med, 2), step_ms_min=round(min(times), 2), step_ms_max=round(max(times), 2),
                   n_runs=len(times), tokens_per_s=round(a.batch * a.seq / (med / 1e3)),
                   mfu=round(a.batch * a.seq / (med / 1e3) * (6 * n_params + 6 * L * d * a.seq) / 989e12, 4),
                   peak_allocated_gib=round(torch.cuda.max_memory_allocated() / 2**30, 3),
                   peak_reserved_gib=round(torch.cuda.max_memory_reserved() / 2**30, 3))
    except torch.OutOfMemoryError as e:
        row.update(oom=True, error=str(e).splitlines()[0][:200])
    print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
