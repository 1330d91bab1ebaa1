#!/usr/bin/env python3
"""Resolves bench_models --host-samples output against the unstripped binary and prints where
the host's time went: the functions most samples were in (self), and the functions most samples
passed through (inclusive), in the executable; samples inside shared libraries are counted by
library.

  python3 tools/host_samples.py SAMPLES bazel-bin/bench/bench_models [--name bench_bench_models] [--top 40]
"""
import argparse
import bisect
import collections
import subprocess


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("samples")
    ap.add_argument("binary")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--name", help="the executable's file name where it ran (default: BINARY's; "
                    "tools/stage_gpu.sh stages bench_models as bench_bench_models)")
    a = ap.parse_args()
    maps, stacks = [], []
    exe = a.name or a.binary.rsplit("/", 1)[-1]
    for line in open(a.samples):
        if line.startswith("maps "):
            f = line.split()
            lo, hi = (int(x, 16) for x in f[1].split("-"))
            path = f[6] if len(f) > 6 else ""
            maps.append((lo, hi, int(f[3], 16), path))
        elif line.strip():
            stacks.append([int(x, 16) for x in line.split()])
    # The executable is position independent: an address's offset in its file is
    # addr - mapping start + mapping file offset, which is the symbol table's address.
    syms = []
    out = subprocess.run(["nm", "-C", "-n", "--defined-only", a.binary], capture_output=True, text=True).stdout
    for line in out.splitlines():
        f = line.split(" ", 2)
        if len(f) == 3 and f[1] in "tTwW":
            syms.append((int(f[0], 16), f[2]))
    addrs = [s[0] for s in syms]

    def where(pc):
        for lo, hi, off, path in maps:
            if lo <= pc < hi:
                if path.rsplit("/", 1)[-1] == exe:
                    i = bisect.bisect_right(addrs, pc - lo + off) - 1
                    return syms[i][1] if i >= 0 else "?"
                return "[" + path.rsplit("/", 1)[-1] + "]"
        return "[unknown]"

    self_count, incl = collections.Counter(), collections.Counter()
    for st in stacks:
        names = [where(pc) for pc in st[2:]]  # frames 0-1: the signal handler and its trampoline
        if not names:
            continue
        self_count[names[0]] += 1
        for n in set(names):
            incl[n] += 1
    n = len(stacks)
    print(f"{n} samples")
    print("self:")
    for name, c in self_count.most_common(a.top):
        print(f"  {100.0 * c / n:5.1f}%  {name[:150]}")
    print("inclusive:")
    for name, c in incl.most_common(a.top):
        print(f"  {100.0 * c / n:5.1f}%  {name[:150]}")


if __name__ == "__main__":
    main()
