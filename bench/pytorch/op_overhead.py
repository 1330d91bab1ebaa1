"""PyTorch side of bench/overhead_bench.cc: eager cost per op of c = a + b on one-element CUDA tensors.

Rows, as memgrad's: no grad and with grad (a requires grad: autograd records a node), each timed
two ways over batches of 100 adds: "sync" (the batch plus the sync that drains it, what
BM_AddNoGrad/BM_AddWithGrad measure) and "host" (the host clock up to the last enqueue, the sync
left out: BM_*Host). Prints one JSON line per row: ns per op, median over --reps batches, min/max.
Usage: python bench/pytorch/op_overhead.py [--reps N]
"""
import argparse
import json
import time

import torch


def measure(grad, host, reps):
    a = torch.ones(1, device="cuda", requires_grad=grad)
    b = torch.ones(1, device="cuda")
    for _ in range(100):
        a + b
    torch.cuda.synchronize()
    per_op = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(100):
            a + b
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        per_op.append(((t1 if host else t2) - t0) / 100 * 1e9)
    per_op.sort()
    return {"ns_per_op": round(per_op[len(per_op) // 2], 1), "ns_min": round(per_op[0], 1),
            "ns_max": round(per_op[-1], 1), "n_runs": reps}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args()
    for grad in (False, True):
        for host in (False, True):
            r = measure(grad, host, a.reps)
            print(json.dumps({"framework": f"pytorch {torch.__version__}", "op": "a + b (1 element, cuda)",
                              "grad": grad, "timing": "host" if host else "sync", **r}), flush=True)


if __name__ == "__main__":
    main()
