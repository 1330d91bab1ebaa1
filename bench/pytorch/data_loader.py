"""PyTorch side of bench/data_bench.cc: the same loads with torch.utils.data on the same host.

1. images/s of a DataLoader over CIFAR-like 3x32x32 f32 tensors with RandomCrop(32, pad 4) +
   horizontal flip + Normalize (written with tensor ops, no torchvision needed), for 0 vs N
   workers (processes here, threads in memgrad). Equal work per image on both sides: the
   augmentation's own cost is measured and a decode stand-in (arithmetic) makes up the rest of
   --decode-us, as bench_data does; transform_us_per_image reports what an image cost.
2. CUDA: H2D bandwidth of a 36.8 MiB batch pageable vs pinned, and the copy/step overlap loop:
   64x3x224x224 batches, a matmul-chain step calibrated to one pinned copy, serial blocking copy
   vs pin_memory=True + .to(non_blocking=True) issued on a side stream.
Prints one JSON line per measurement.   python3 bench/pytorch/data_loader.py [--workers 1,2,4,8]
"""
import argparse
import json
import math
import time

import torch
from torch.utils.data import DataLoader, Dataset


def spin(iters, seed):
    acc = float(seed & 0xFF)
    for i in range(iters):
        acc = math.sqrt(acc + i)
    return acc


class Cifarish(Dataset):
    def __init__(self, n, iters=0):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(n, 3, 32, 32, generator=g)
        self.y = torch.arange(n)
        self.iters = iters
        self.mean = torch.tensor([0.49, 0.48, 0.45]).view(3, 1, 1)
        self.std = torch.tensor([0.25, 0.24, 0.26]).view(3, 1, 1)

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        spin(self.iters, i)
        x = torch.nn.functional.pad(self.x[i], (4, 4, 4, 4))
        t, l = torch.randint(0, 9, (2,)).tolist()
        x = x[:, t:t + 32, l:l + 32]
        if torch.rand(()) < 0.5:
            x = x.flip(-1)
        return (x - self.mean) / self.std, self.y[i]


def iters_for_us(us):
    if us <= 0:
        return 0
    n = 200000
    t0 = time.perf_counter()
    spin(n, 1)
    return max(1, int(us * 1e-6 / ((time.perf_counter() - t0) / n)))


def images_per_s(loader, epochs):
    for _ in loader:  # warm-up epoch (worker start-up)
        pass
    n, t0 = 0, time.perf_counter()
    for _ in range(epochs):
        for x, _ in loader:
            n += x.shape[0]
    return n / (time.perf_counter() - t0)


def transform_us(ds, n):
    """Microseconds per image of ds[i] (the transform), serially over the first n images."""
    n = min(n, len(ds))
    t0 = time.perf_counter()
    for i in range(n):
        ds[i]
    return (time.perf_counter() - t0) * 1e6 / n


def bench_workers(a):
    ds = Cifarish(a.images)
    ds.iters = iters_for_us(max(0.0, a.decode_us - transform_us(ds, 2000)))
    per_image_us = transform_us(ds, 500)
    base = None
    for w in [0] + a.workers:
        loader = DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=w,
                            persistent_workers=w > 0)
        ips = images_per_s(loader, a.epochs)
        base = base or ips
        print(json.dumps({"bench": "loader_workers", "workers": w, "images_per_s": round(ips),
                          "ratio_vs_0_workers": round(ips / base, 2), "decode_us": a.decode_us,
                          "transform_us_per_image": round(per_image_us, 1)}), flush=True)


def bench_cuda():
    dev = torch.device("cuda")
    b, n = 64, 16 * 64
    x = torch.rand(n, 3, 224, 224)
    batch_bytes = b * 3 * 224 * 224 * 4
    host = torch.rand(batch_bytes // 4)
    d = torch.empty_like(host, device=dev)
    base = None
    for name, src in (("pageable", host), ("pinned", host.pin_memory())):
        d.copy_(src)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            d.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        gbs = 20 * batch_bytes / (time.perf_counter() - t0) / 1e9
        base = base or gbs
        print(json.dumps({"bench": "h2d", "memory": name, "GB_per_s": round(gbs, 2),
                          "ratio_vs_pageable": round(gbs / base, 2)}))

    pinned = x[:b].pin_memory()
    dd = torch.empty_like(pinned, device=dev)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        dd.copy_(pinned, non_blocking=True)
    torch.cuda.synchronize()
    copy_ms = (time.perf_counter() - t0) * 100
    w = torch.rand(4096, 4096, device=dev)

    def step(batch, reps):
        h = batch.reshape(batch.shape[0], -1)[:, :4096].contiguous()
        for _ in range(reps):
            acc = h @ w
        return acc.sum()

    step(dd, 1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        step(dd, 1)
    torch.cuda.synchronize()
    reps = max(1, round(copy_ms / ((time.perf_counter() - t0) * 200)))

    ds = torch.utils.data.TensorDataset(x, torch.zeros(n, dtype=torch.long))
    side = torch.cuda.Stream()
    base = None
    for name, pin, overlap in (("serial pageable", False, False), ("side stream pageable", False, True),
                               ("serial pinned", True, False), ("side stream pinned", True, True)):
        loader = DataLoader(ds, batch_size=b, num_workers=4, pin_memory=pin, persistent_workers=True)
        for epoch in range(2):  # epoch 0 warms up workers, pinned buffers and the allocator
            it = iter(loader)

            def fetch():
                try:
                    hb = next(it)[0]
                except StopIteration:
                    return None
                if not overlap:
                    return hb
                with torch.cuda.stream(side):  # like memgrad's loader: the copy goes on a side stream
                    return hb.to(dev, non_blocking=True)

            torch.cuda.synchronize()
            t0, total, k = time.perf_counter(), None, 0
            cur = fetch()
            while cur is not None:
                if overlap:
                    torch.cuda.current_stream().wait_stream(side)
                    cur.record_stream(torch.cuda.current_stream())
                else:
                    cur = cur.to(dev)  # blocking copy on the compute stream
                s = step(cur, reps)
                total = s if total is None else total + s
                k += 1
                cur = fetch()  # issued after step k is queued: copy k+1 overlaps it
            torch.cuda.synchronize()
            ms = (time.perf_counter() - t0) * 1e3 / k
        base = base or ms
        print(json.dumps({"bench": "overlap", "mode": name, "ms_per_batch": round(ms, 2),
                          "speedup_vs_serial_pageable": round(base / ms, 2), "copy_ms": round(copy_ms, 2),
                          "step_reps": reps}))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--images", type=int, default=20000)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--decode-us", type=float, default=50)
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    a.workers = [int(w) for w in a.workers.split(",")]
    bench_workers(a)
    if torch.cuda.is_available():
        bench_cuda()


if __name__ == "__main__":
    main()
