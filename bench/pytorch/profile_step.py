"""PyTorch's side of `bench_models --profile`: one training step's CUDA kernels by device time,
for a model and precision row of models_step.py (the same model, data and optimizer), so the
two tables can be read kernel family by kernel family.
    python3 bench/pytorch/profile_step.py [--model gpt2-124M] [--row f32] [--optimizer adamw]
                                          [--steps 3] [--top 16]
Prints "kernel  calls/step  ms/step  %" rows, then the device total per step.
"""
import argparse

import torch

import models_step as ms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt2-124M", choices=list(ms.MODELS))
    ap.add_argument("--row", default="f32", choices=[r[0] for r in ms.ROWS])
    ap.add_argument("--optimizer", default="adamw", choices=["sgd", "adamw"])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=16)
    a = ap.parse_args()
    _, tf32, dtype, channels_last, _ = next(r for r in ms.ROWS if r[0] == a.row)
    ms.set_tf32(tf32)
    torch.manual_seed(0)
    model, loss_of = ms.MODELS[a.model][1](channels_last)
    opt = ms.make_optimizer(model.parameters(), a.optimizer)
    step = ms.train_step(model, loss_of, opt, dtype)
    for _ in range(3):  # warm-up: cuBLAS heuristics, the allocator's pools, the optimizer's state
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(a.steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total
        if us > 0:
            rows.append((us / a.steps / 1e3, e.count / a.steps, e.key))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows)
    print(f"# torch {torch.__version__}, {a.model} {a.row} {a.optimizer}, {a.steps} profiled steps")
    print(f"{'kernel':48s} {'calls/st':>9s} {'ms/step':>10s} {'%':>6s}")
    for ms_step, calls, name in rows[:a.top]:
        print(f"{name[:48]:48s} {calls:9.1f} {ms_step:10.3f} {100 * ms_step / total:6.1f}")
    print(f"device total {total:.3f} ms/step over {len(rows)} kernel names")


if __name__ == "__main__":
    main()
