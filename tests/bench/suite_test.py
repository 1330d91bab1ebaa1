"""Runs `//bench:suite --quick --cpu` and checks what it writes: results.json follows the
schema (records.validate), every entry that did not run says why, the CPU subset measured
something, report.md has its tables and index.html is one self-contained page."""
import json
import os
import re
import subprocess
import sys
import unittest

import records


def runfile(path):
    return os.path.join(os.environ["TEST_SRCDIR"], os.environ.get("TEST_WORKSPACE", "memgrad"), path)


class SuiteQuickCpuTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "suite")
        p = subprocess.run([runfile("bench/suite"), "--quick", "--cpu", "--out", cls.out], capture_output=True,
                           text=True, timeout=280)
        sys.stdout.write(p.stdout + p.stderr)
        cls.rc = p.returncode
        with open(os.path.join(cls.out, "results.json")) as f:
            cls.doc = json.load(f)

    def test_exits_cleanly(self):
        self.assertEqual(self.rc, 0)

    def test_results_follow_the_schema(self):
        self.assertEqual(records.validate(self.doc), [])

    def test_cpu_subset_measured(self):
        ok = {e["technique"] for e in self.doc["entries"] if e["status"] == "ok"}
        # The entries that run without a device (recompute, optim, data, distributed, interop).
        self.assertTrue({"recompute", "optim", "data", "distributed", "interop"} <= ok, ok)
        for r in self.doc["records"]:
            self.assertNotEqual(r["unit"], "", f"{r['entry']} {r['metric']}: a metric without a unit")

    def test_every_entry_not_run_says_why(self):
        for e in self.doc["entries"]:
            if e["status"] != "ok":
                self.assertTrue(e["reason"], e)

    def test_device_only_entries_skipped_on_cpu(self):
        models = [e for e in self.doc["entries"] if e["technique"] == "models"]
        self.assertTrue(models and all(e["status"] == "skipped" for e in models))
        self.assertEqual(self.doc["suite"]["device"], "cpu")

    def test_report_md_has_the_tables(self):
        with open(os.path.join(self.out, "report.md")) as f:
            text = f.read()
        for heading in ("## Environment", "## Entries", "## Headline", "## Activation recomputation"):
            self.assertIn(heading, text)
        self.assertIn("not measured in this run", text)  # the GPU-only techniques

    def test_index_html_is_self_contained(self):
        with open(os.path.join(self.out, "index.html")) as f:
            page = f.read()
        self.assertIn("<svg", page)
        self.assertNotIn("<script", page.lower())
        self.assertIsNone(re.search(r"(src|href)\s*=\s*['\"]?(https?:)?//", page), "a network reference")
        self.assertIn("not measured in this run", page)


if __name__ == "__main__":
    unittest.main()
