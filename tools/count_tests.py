#!/usr/bin/env python3
"""Counts gtest results from Bazel's test.xml files and prints "N passed, M failed, K skipped"."""
import os
import sys
import xml.etree.ElementTree as ET

root = sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs"
# Optional: Bazel's console log. A target Bazel reports FAILED whose gtest cases all passed
# (a leak report or crash at exit) counts as one failure, so the line never hides it.
bazel_log = sys.argv[2] if len(sys.argv) > 2 else None
passed = failed = skipped = 0
broken = []
failed_targets = set()
if bazel_log and os.path.exists(bazel_log):
    for line in open(bazel_log, errors="replace"):
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith("//") and parts[1] in ("FAILED", "TIMEOUT", "NO"):
            failed_targets.add(parts[0])
for dirpath, _, files in os.walk(root, followlinks=True):
    if "test.xml" not in files:
        continue
    path = os.path.join(dirpath, "test.xml")
    try:
        tree = ET.parse(path)
    except ET.ParseError:
        broken.append(path)
        continue
    cases = tree.getroot().iter("testcase")
    rel = os.path.relpath(dirpath, root)
    target = "//" + os.path.dirname(rel) + ":" + os.path.basename(rel)
    failed_before = failed
    n = 0
    for tc in cases:
        n += 1
        if tc.find("failure") is not None or tc.find("error") is not None:
            failed += 1
        elif tc.find("skipped") is not None or tc.get("result") == "skipped" or tc.get("status") == "notrun":
            skipped += 1
        else:
            passed += 1
    if n == 0:
        # A test binary that crashed before writing cases: Bazel writes a stub with one
        # <failure> at the testsuite level.
        if tree.getroot().find(".//failure") is not None or tree.getroot().find(".//error") is not None:
            failed += 1
    if target in failed_targets and failed == failed_before:
        print(f"{target}: Bazel reports it failed although its test cases passed (exit-time error)", file=sys.stderr)
        failed += 1
for b in broken:
    print(f"unreadable result file: {b}", file=sys.stderr)
    failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
