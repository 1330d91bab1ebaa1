#!/usr/bin/env python3
"""Checks of the suite report's units and chart labels, without running a benchmark:

    python3 bench/runner/report_test.py
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import records  # noqa: E402
import svg  # noqa: E402


class UnitTest(unittest.TestCase):
    def test_each_metric_has_its_unit(self):
        cases = {
            "step_ms": "ms", "ms": "ms", "copy_ms": "ms", "ms_per_batch": "ms", "transform_us_per_image": "us",
            "ns_per_op": "ns", "peak_allocated_gib": "GiB", "nvml_peak_used_gib": "GiB", "peak_alloc_GiB": "GiB",
            "offloaded_gib": "GiB", "live_mib": "MiB", "worst_delta_bytes": "bytes",
            "offload_used_in_place": "count", "device_calls": "count", "passed": "bool",
            "tokens_per_s": "tokens/s", "samples_per_s": "samples/s", "images_per_s": "images/s",
            "GB/s": "GB/s", "TFLOP/s": "TFLOP/s", "of_copy": "x", "vs_simt": "x", "speedup_vs_f32": "x",
            "ratio_vs_0_workers": "x", "reserved_over_alloc": "x", "mfu": "fraction",
            "state_bytes_per_param": "bytes", "host_state_bytes_per_param": "bytes",
            "activation_kib_per_token": "KiB", "activation_kib_per_image": "KiB",
        }
        for name, unit in cases.items():
            self.assertEqual(records.unit_of(name), unit, name)

    def test_configuration_fields_are_not_metrics(self):
        for name in ("decode_us", "tensor_mib", "seq", "workers", "B"):
            self.assertIsNone(records.unit_of(name), name)

    def test_a_stored_wrong_unit_is_shown_right(self):
        self.assertEqual(records.display_unit({"metric": "nvml_peak_used_gib", "unit": "us"}), "GiB")
        self.assertEqual(records.display_unit({"metric": "real_time", "unit": "ns"}), "ns")


class LabelTest(unittest.TestCase):
    def test_crowded_labels_do_not_overlap(self):
        anchors = [(200 + (i % 3), 150 + (i % 4), f"point number {i}") for i in range(12)]
        placed = svg.place_labels(anchors, 640, 38, 400)
        boxes = [svg.label_box(x, y, t, a) for (x, y, a), (_, _, t) in zip(placed, anchors)]
        for i, a in enumerate(boxes):
            for b in boxes[i + 1:]:
                self.assertFalse(svg.overlaps(a, b), (a, b))

    def test_a_label_near_the_right_edge_goes_left(self):
        (x, _, anchor), = svg.place_labels([(630, 100, "a long label")], 640, 38, 300)
        self.assertEqual(anchor, "end")
        self.assertLess(x, 630)

    def test_coincident_points_share_a_label(self):
        merged = svg.merge_coincident([(10, 10, "mlp f32"), (10.5, 10, "gpt2 f32"), (50, 50, "gpt2 bf16")])
        self.assertEqual(merged, [(10, 10, "mlp f32 (+1)"), (50, 50, "gpt2 bf16")])

    def test_a_chart_with_many_points_renders(self):
        series = [("memgrad", 0, [(1 + i / 10, 1 - i / 50, f"p{i}") for i in range(40)])]
        out = svg.points("t", series, "x", "y")
        self.assertIn("<svg", out)
        self.assertEqual(out.count('class="point"'), 40)


if __name__ == "__main__":
    unittest.main()
