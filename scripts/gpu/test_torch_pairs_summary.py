#!/usr/bin/env python3
"""Tests of torch_pairs_summary.py (standard library, no GPU): each process's speed-up is taken
before the median over processes, the targets are read from the medians, a pattern missing from a
run is counted, and logs that hold no comparison get an error that names them."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_pairs_summary as tps  # noqa: E402

HEAD = ("torch_alloc_pairs: native vs gpumem, 200000 pairs (1 thread), 20000 pairs per thread (%d threads), "
        "median of 3 rounds\n"
        "c10::cuda::current_device() (in every raw_alloc of both): 59.3 ns (1 thread), 5029.9 ns/thread (4 threads)\n"
        "pattern                         native ns    gpumem ns  speedup    native ns/thr  gpumem ns/thr  speedup "
        "driver calls 1t / Tt   driver ns (1t)\n")


def row(name, n1, g1, nt, gt, c1=0, ct=0, d1=0.0):
    return "%-28s %12.1f %12.1f %7.2fx   %14.1f %14.1f %7.2fx %20s %16.1f\n" % (
        name, n1, g1, n1 / g1, nt, gt, nt / gt, "%d / %d" % (c1, ct), d1)


def log(rows, threads=4, tail="gpumem after the run: classic segments peak 0\n"):
    return HEAD % threads + "".join(rows) + tail


class Summary(unittest.TestCase):
    def write(self, d, name, text):
        path = os.path.join(d, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_speedup_per_process_then_median(self):
        # Process 1 runs fast, process 3 slow: the ns columns spread, the per-process ratios less.
        a = log([row("4 KiB pairs", 400, 100, 12000, 200), row("window 1024, 512 B-32 MiB", 900, 300, 20000, 1800,
                                                               5093, 2786, 78.6)])
        b = log([row("4 KiB pairs", 600, 120, 14000, 250), row("window 1024, 512 B-32 MiB", 1200, 380, 21000, 1500)])
        c = log([row("4 KiB pairs", 800, 250, 15000, 260), row("window 1024, 512 B-32 MiB", 1300, 420, 22000, 900)])
        runs = [("a", *tps.parse("a", a)), ("b", *tps.parse("b", b)), ("c", *tps.parse("c", c))]
        threads, entries = tps.summarize(runs)
        self.assertEqual(threads, 4)
        self.assertEqual([e["pattern"] for e in entries], ["4 KiB pairs", "window 1024, 512 B-32 MiB"])
        k4, w = entries
        # speed-ups 4.0, 5.0, 3.2: median 4.0 (not 600 / 120 = 5.0 from the medians of the columns)
        self.assertAlmostEqual(k4["speedup_1t"]["median"], 4.0)
        self.assertAlmostEqual(k4["speedup_1t"]["min"], 3.2)
        self.assertAlmostEqual(k4["speedup_1t"]["max"], 5.0)
        self.assertEqual(k4["native_1t_ns"]["median"], 600)
        self.assertTrue(all(k4["meets"].values()))
        # window 1024: 3.0, 3.158, 3.095 -> 3.095 >= 3; T threads 1800 / 1500 / 900 -> 1500 ns: not under 1 us
        self.assertAlmostEqual(w["speedup_1t"]["median"], 1300 / 420)
        self.assertTrue(w["meets"]["speedup_1t"])
        self.assertEqual(w["gpumem_tt_ns"]["median"], 1500)
        self.assertFalse(w["meets"]["under_1us_tt"])
        self.assertEqual(w["driver_1t_ns"]["max"], 78.6)
        text = tps.render(threads, entries, 3)
        self.assertIn("4t<1us NO", text)
        self.assertIn("patterns meeting all three targets by the median: 1 of 2", text)

    def test_below_target_and_missing_pattern(self):
        a = log([row("4 KiB pairs", 400, 100, 12000, 200), row("window 64, 512 B-32 MiB", 700, 250, 20000, 1000)])
        b = log([row("4 KiB pairs", 500, 180, 12000, 200)])
        threads, entries = tps.summarize([("a", *tps.parse("a", a)), ("b", *tps.parse("b", b))])
        k4, w64 = entries
        self.assertAlmostEqual(k4["speedup_1t"]["median"], (4.0 + 500 / 180) / 2)
        self.assertEqual(w64["runs"], 1)
        self.assertFalse(w64["meets"]["speedup_1t"])   # 2.8x
        self.assertFalse(w64["meets"]["under_1us_tt"])  # exactly 1,000 ns is not under 1 us
        text = tps.render(threads, entries, 2)
        self.assertIn("(in 1 of 2 runs)", text)
        self.assertIn("1t>=3x NO", text)

    def test_errors_name_the_file(self):
        with self.assertRaisesRegex(tps.LogError, r"^x: no torch_alloc_pairs table in it .*first line: boom"):
            tps.parse("x", "boom\nterminate called after throwing\n")
        with self.assertRaisesRegex(tps.LogError, r"^x: no torch_alloc_pairs table"):
            tps.parse("x", "")
        with self.assertRaisesRegex(tps.LogError, r"^s: a --sim run"):
            tps.parse("s", "torch_alloc_pairs --sim: gpumem on a simulated device through gpumem_malloc ...\n")
        with self.assertRaisesRegex(tps.LogError, r"gpumem time of 0 ns"):
            tps.parse("z", log(["4 KiB pairs                         400.0          0.0    0.00x            1.0"
                                "            0.0    0.00x                0 / 0              0.0\n"]))
        one = ("a", *tps.parse("a", log([row("4 KiB pairs", 400, 100, 12000, 200)], threads=4)))
        two = ("b", *tps.parse("b", log([row("4 KiB pairs", 400, 100, 12000, 200)], threads=8)))
        with self.assertRaisesRegex(tps.LogError, r"different thread counts \(4, 8\)"):
            tps.summarize([one, two])

    def test_command_line(self):
        with tempfile.TemporaryDirectory() as d:
            a = self.write(d, "a.log", log([row("4 KiB pairs", 400, 100, 12000, 200)]))
            b = self.write(d, "b.log", log([row("4 KiB pairs", 450, 100, 12000, 300)]))
            bad = self.write(d, "bad.log", "torch_alloc_pairs: no CUDA device; nothing measured\n")
            js = os.path.join(d, "s.json")
            script = os.path.join(HERE, "torch_pairs_summary.py")
            r = subprocess.run([sys.executable, script, a, b, "--json", js], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("torch_alloc_pairs over 2 processes", r.stdout)
            self.assertIn("4.25x (4.00..4.50)", r.stdout)
            with open(js) as f:
                s = json.load(f)
            self.assertEqual(s["runs"], 2)
            self.assertAlmostEqual(s["patterns"][0]["speedup_1t"]["median"], 4.25)
            r = subprocess.run([sys.executable, script, a, bad], capture_output=True, text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("bad.log: no torch_alloc_pairs table in it", r.stderr)
            self.assertIn("no CUDA device", r.stderr)
            r = subprocess.run([sys.executable, script, os.path.join(d, "missing.log")], capture_output=True,
                               text=True)
            self.assertEqual(r.returncode, 2)
            self.assertIn("missing.log: cannot read it", r.stderr)


if __name__ == "__main__":
    unittest.main()
