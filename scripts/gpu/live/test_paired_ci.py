#!/usr/bin/env python3
"""Tests of paired_ci.py (standard library, no GPU): ratios pair only runs of one repetition of one
file, the interval from Student's t on log ratios, its verdicts, and the errors for bad input."""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import paired_ci  # noqa: E402


def run(workload, mode, rep, step_s, status="ok"):
    return {"workload": workload, "mode": mode, "rep": rep, "step_s": step_s, "status": status}


def write_jsonl(d, name, runs):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        for r in runs:
            f.write(json.dumps(r) + "\n")
    return path


class PairedCi(unittest.TestCase):
    def test_ratios_pair_within_a_repetition_of_one_file(self):
        with tempfile.TemporaryDirectory() as d:
            a = write_jsonl(d, "a.jsonl", [run("w", "native", 0, 1.0), run("w", "gpumem", 0, 1.1),
                                           run("w", "native", 1, 2.0), run("w", "gpumem", 1, 2.2)])
            # Rep 0 of a second file: only its own native is its reference, never file a's.
            b = write_jsonl(d, "b.jsonl", [run("w", "native", 0, 4.0), run("w", "gpumem", 0, 3.0),
                                           run("w", "gpumem", 1, 9.0)])  # no native in rep 1: unpaired
            runs = paired_ci.load_runs([a, b])
            self.assertEqual(sorted(paired_ci.paired_ratios(runs, "w", "gpumem", "native", "step_s")),
                             sorted([1.1, 1.1, 0.75]))

    def test_failed_runs_are_left_out(self):
        with tempfile.TemporaryDirectory() as d:
            a = write_jsonl(d, "a.jsonl", [run("w", "native", 0, 1.0),
                                           run("w", "gpumem", 0, 5.0, status="timeout")])
            runs = paired_ci.load_runs([a])
            self.assertEqual(paired_ci.paired_ratios(runs, "w", "gpumem", "native", "step_s"), [])

    def test_interval_is_student_t_on_log_ratios(self):
        ratios = [1.0, 1.02, 0.98, 1.04, 0.96]
        logs = [math.log(r) for r in ratios]
        mean = sum(logs) / 5
        sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 4)
        half = 2.776 * sd / math.sqrt(5)
        lo, hi = paired_ci.confidence_interval(ratios)
        self.assertAlmostEqual(lo, math.exp(mean - half), places=12)
        self.assertAlmostEqual(hi, math.exp(mean + half), places=12)
        self.assertIsNone(paired_ci.confidence_interval([1.0, 1.1]))
        # Identical ratios: a zero-width interval at that ratio.
        self.assertEqual(paired_ci.confidence_interval([1.005] * 4), (1.005, 1.005))

    def test_verdicts(self):
        self.assertIn("shown", paired_ci.verdict((0.99, 1.008), 1.01))
        self.assertIn("slower than the target allows", paired_ci.verdict((1.02, 1.05), 1.01))
        self.assertIn("cannot tell: no difference is seen", paired_ci.verdict((0.95, 1.05), 1.01))
        self.assertIn("straddles", paired_ci.verdict((1.001, 1.05), 1.01))
        self.assertIn("fewer than 3", paired_ci.verdict(None, 1.01))

    def test_table_and_errors_through_the_command_line(self):
        script = os.path.join(HERE, "paired_ci.py")
        with tempfile.TemporaryDirectory() as d:
            runs = []
            for rep, (n, g) in enumerate([(1.0, 1.0), (1.0, 1.01), (1.0, 0.99)]):
                runs += [run("w", "native", rep, n), run("w", "gpumem", rep, g)]
            good = write_jsonl(d, "good.jsonl", runs)
            out = subprocess.run([sys.executable, script, good], capture_output=True, text=True)
            self.assertEqual(out.returncode, 0, out.stderr)
            row = [l for l in out.stdout.splitlines() if l.startswith("w ")]
            self.assertEqual(len(row), 1)
            self.assertIn("gpumem", row[0])
            self.assertIn("  3  ", row[0])

            out = subprocess.run([sys.executable, script, good, "--ref", "expandable"],
                                 capture_output=True, text=True)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("no run of the reference mode 'expandable'", out.stderr)
            self.assertIn("modes there: gpumem, native", out.stderr)

            bad = os.path.join(d, "bad.jsonl")
            with open(bad, "w") as f:
                f.write("{not json\n")
            out = subprocess.run([sys.executable, script, bad], capture_output=True, text=True)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("bad.jsonl:1: not a JSON line", out.stderr)

            out = subprocess.run([sys.executable, script, os.path.join(d, "missing.jsonl")],
                                 capture_output=True, text=True)
            self.assertNotEqual(out.returncode, 0)
            self.assertIn("cannot read", out.stderr)

            out = subprocess.run([sys.executable, script, good, "--target", "0"],
                                 capture_output=True, text=True)
            self.assertEqual(out.returncode, 2)
            self.assertIn("must be a positive ratio", out.stderr)


if __name__ == "__main__":
    unittest.main()
