#!/usr/bin/env python3
"""What a Chrome trace (mg::profiler's, or torch.profiler's) holds, one line per kind of event:
host op ranges, phases, backward nodes, collectives, device kernels (how many linked to an op by
a flow, their summed time, NCCL's among them), copies and fills, memory counter samples and
allocator instants.

    python3 tools/trace_summary.py step.json[.gz]

Python 3 standard library only.
"""
import collections
import gzip
import json
import sys


def main():
    path = sys.argv[1]
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ranges = collections.Counter()
    kernels = linked = nccl = 0
    kernel_ms = nccl_ms = 0.0
    counters = collections.Counter()
    instants = collections.Counter()
    collectives = collections.Counter()
    for e in events:
        ph, cat = e.get("ph"), e.get("cat", "")
        if ph == "X" and cat == "kernel":
            kernels += 1
            kernel_ms += e["dur"] * 1e-3
            linked += "op" in e.get("args", {})
            if e["name"].startswith("nccl"):
                nccl += 1
                nccl_ms += e["dur"] * 1e-3
        elif ph == "X":
            ranges[cat] += 1
            if cat == "collective":
                collectives[e["name"]] += 1
        elif ph == "C":
            counters[e["name"]] += 1
        elif ph in ("i", "I"):
            instants[e["name"]] += 1
    print(f"{path}: {len(events)} events")
    print("  host ranges by category: " + ", ".join(f"{k} {v}" for k, v in sorted(ranges.items())))
    print("  collectives: " + (", ".join(f"{k} {v}" for k, v in sorted(collectives.items())) or "none"))
    print(f"  kernels: {kernels}, {linked} linked to their op, {kernel_ms:.3f} ms; NCCL's: {nccl}, {nccl_ms:.3f} ms")
    print("  counter samples: " + (", ".join(f"{k} {v}" for k, v in sorted(counters.items())) or "none"))
    print("  instants: " + (", ".join(f"{k} {v}" for k, v in sorted(instants.items())) or "none"))


if __name__ == "__main__":
    main()
