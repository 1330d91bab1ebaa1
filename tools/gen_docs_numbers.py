#!/usr/bin/env python3
"""Writes the numbers that several pages repeat from one results file, so the pages agree.

    python3 tools/gen_docs_numbers.py [--results bench/results/headline.json] [--check]

A page marks each generated span with a pair of HTML comments (invisible when rendered):

    <!-- numbers:gpt2_headline -->...<!-- /numbers -->

The text between them is replaced by the block of that name, rendered from the results file.
Pages searched: README.md and docs/*.md. --check rewrites nothing and exits 1 when a page's
text differs from what this script would write (CI runs it). Python 3 standard library only.
"""
import argparse
import glob
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join("bench", "results", "headline.json")
MARKER = re.compile(r"(<!-- numbers:([a-z0-9_]+) -->)(.*?)(<!-- /numbers -->)", re.S)


def median(xs):
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def spread(xs, fmt="{:.2f}"):
    """'16.65 (16.54-16.71)' for several runs, '16.65' for one."""
    m = fmt.format(median(xs))
    if len(xs) == 1:
        return m
    return f"{m} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"


def ktok(xs):
    """Tokens/s in thousands: '577K' (median), '576K-578K' as a range when there are several."""
    k = [round(x / 1000) for x in xs]
    if len(xs) == 1 or min(k) == max(k):
        return f"{round(median(xs) / 1000)}K"
    return f"{min(k)}K-{max(k)}K"


def gpt2_headline(r):
    m, c = r["memgrad"], r["pytorch_compile"]
    return (
        f"GPT-2 124M bf16 autocast AdamW on the {r['card'].replace('NVIDIA ', '')}, eager: "
        f"B=8 {spread(m['b8_step_ms'])} ms a step and {m['b8_peak_allocated_gib']:.2f} GiB, "
        f"B=32 {ktok(m['b32_tokens_per_s'])} tokens/s and {m['b32_peak_allocated_gib']:.2f} GiB; "
        f"torch.compile {spread(c['b8_step_ms'])} ms / {c['b8_peak_allocated_gib']:.2f} GiB and "
        f"{ktok(c['b32_tokens_per_s'])} tokens/s / {c['b32_peak_allocated_gib']:.2f} GiB on the same card "
        f"(`{r['source']}`)"
    )


def gpt2_headline_table(r):
    rows = [("memgrad", r["memgrad"]), ("PyTorch eager", r["pytorch_eager"]),
            ("torch.compile", r["pytorch_compile"])]
    out = [
        "",
        f"{r['workload']}; {r['card']}, {r['date']}, commit {r['commit']}; "
        f"medians with (min-max) over runs; source `{r['source']}`, collected in "
        "`bench/results/headline.json`.",
        "",
        "| | B=8 step ms | B=8 peak allocated | B=32 tokens/s | B=32 peak allocated |",
        "|---|---|---|---|---|",
    ]
    for name, x in rows:
        out.append(
            f"| {name} | {spread(x['b8_step_ms'])} | {x['b8_peak_allocated_gib']:.2f} GiB | "
            f"{ktok(x['b32_tokens_per_s'])} | {x['b32_peak_allocated_gib']:.2f} GiB |")
    out.append("")
    return "\n".join(out)


BLOCKS = {"gpt2_headline": gpt2_headline, "gpt2_headline_table": gpt2_headline_table}


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def fill(text, results, where="<text>"):
    """Returns text with every marked block rendered from results."""
    def sub(m):
        name = m.group(2)
        if name not in BLOCKS:
            sys.exit(f"gen_docs_numbers: {where}: unknown block '{name}' (known: {', '.join(BLOCKS)})")
        return m.group(1) + BLOCKS[name](results) + m.group(4)
    return MARKER.sub(sub, text)


def pages(root):
    return [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, DEFAULT_RESULTS))
    ap.add_argument("--check", action="store_true", help="exit 1 if a page is out of date; write nothing")
    a = ap.parse_args()
    results = load(a.results)
    stale, blocks = [], 0
    for path in pages(ROOT):
        if not os.path.exists(path):
            continue
        with open(path, encoding="utf-8") as f:
            text = f.read()
        blocks += len(MARKER.findall(text))
        new = fill(text, results, os.path.relpath(path, ROOT))
        if new == text:
            continue
        stale.append(os.path.relpath(path, ROOT))
        if not a.check:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    if a.check:
        if stale:
            print("gen_docs_numbers: out of date with " + os.path.relpath(a.results, ROOT) + ": " +
                  ", ".join(stale) + " (run python3 tools/gen_docs_numbers.py)")
            return 1
        print(f"gen_docs_numbers: {blocks} blocks up to date")
        return 0
    print(f"gen_docs_numbers: {blocks} blocks, rewrote {', '.join(stale) or 'nothing'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
