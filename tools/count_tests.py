#!/usr/bin/env python3
"""Counts gtest results from Bazel's test.xml files and prints "N passed, M failed, K skipped"."""
import os
import sys
import xml.etree.ElementTree as ET

root = sys.argv[1] if len(sys.argv) > 1 else "bazel-testlogs"
passed = failed = skipped = 0
broken = []
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
for b in broken:
    print(f"unreadable result file: {b}", file=sys.stderr)
    failed += 1
print(f"{passed} passed, {failed} failed, {skipped} skipped")
