#!/usr/bin/env python3
"""Tests of torch_pairs_summary.py and torch_pairs_reps.sh (standard library, no GPU): each
process's speed-up is taken before the median over processes, the targets are read from the
medians, a pattern missing from a run is counted, logs that hold no comparison get an error that
names them; the script runs each process, leaves a failed one out and says so, and refuses bad
arguments with one line each."""

import json
import os
import shutil
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


class RepsScript(unittest.TestCase):
    """torch_pairs_reps.sh with a stand-in torch_alloc_pairs (a shell script printing a table): the
    argument errors, and a run whose processes differ, summarized into the files it promises."""

    SCRIPT = os.path.join(HERE, "torch_pairs_reps.sh")

    def run_script(self, build, out, *args, cpus=""):
        env = dict(os.environ, BUILD=build, OUT=out, TORCH_PAIRS_CPUS=cpus)
        env.pop("GPUMEM_GPU_ENV_DONE", None)
        return subprocess.run(["bash", self.SCRIPT, *args], capture_output=True, text=True, env=env, timeout=120)

    def fake_build(self, d, body):
        os.makedirs(os.path.join(d, "bench"))
        path = os.path.join(d, "bench", "torch_alloc_pairs")
        with open(path, "w") as f:
            f.write("#!/usr/bin/env bash\n" + body)
        os.chmod(path, 0o755)
        return d

    def test_runs_each_process_and_summarizes(self):
        with tempfile.TemporaryDirectory() as d:
            # Each process reads a counter so that they differ: 4.0x, 5.0x, 4.5x -> median 4.5x.
            table = {1: log([row("4 KiB pairs", 400, 100, 12000, 200)]),
                     2: log([row("4 KiB pairs", 500, 100, 12000, 200)]),
                     3: log([row("4 KiB pairs", 450, 100, 12000, 200)])}
            for k, text in table.items():
                with open(os.path.join(d, "t%d" % k), "w") as f:
                    f.write(text)
            body = ('n=$(cat "%s/count" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "%s/count"\n'
                    'echo "args: $*"; cat "%s/t$n"\n') % (d, d, d)
            build = self.fake_build(os.path.join(d, "build"), body)
            out = os.path.join(d, "out")
            r = self.run_script(build, out, "3", "--", "--ops", "10")
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
            self.assertIn("args: --ops 10", r.stdout)
            with open(os.path.join(out, "torch-pairs-summary.txt")) as f:
                summary = f.read()
            self.assertIn("over 3 processes", summary)
            self.assertIn("4.50x (4.00..5.00)", summary)
            with open(os.path.join(out, "torch-pairs-summary.json")) as f:
                self.assertEqual(json.load(f)["runs"], 3)
            self.assertTrue(all(os.path.exists(os.path.join(out, "run-%d.log" % k)) for k in (1, 2, 3)))

    def test_failed_run_is_left_out_and_reported(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "t"), "w") as f:
                f.write(log([row("4 KiB pairs", 400, 100, 12000, 200)]))
            body = ('n=$(cat "%s/count" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "%s/count"\n'
                    '[ $n = 2 ] && { echo "CUDA error"; exit 3; }; cat "%s/t"\n') % (d, d, d)
            build = self.fake_build(os.path.join(d, "build"), body)
            r = self.run_script(build, os.path.join(d, "out"), "3")
            self.assertEqual(r.returncode, 1)
            self.assertIn("run 2 exited 3", r.stdout)
            self.assertIn("over 2 processes", r.stdout)

    def test_argument_errors(self):
        with tempfile.TemporaryDirectory() as d:
            build = self.fake_build(os.path.join(d, "build"), "exit 0\n")
            out = os.path.join(d, "out")
            for args, message in [(["x"], "REPS must be a positive integer, got 'x'"),
                                  (["0"], "REPS must be a positive integer, got '0'"),
                                  (["2", "--ops", "5"], "usage:"),
                                  (["2", "--", "--sim"], "--sim has no native column")]:
                r = self.run_script(build, out, *args)
                self.assertEqual(r.returncode, 2, args)
                self.assertIn(message, r.stderr)
            r = self.run_script(os.path.join(d, "nowhere"), out, "2")
            self.assertEqual(r.returncode, 2)
            self.assertIn("nowhere/bench/torch_alloc_pairs is not there", r.stderr)
            if shutil.which("taskset"):
                r = self.run_script(build, out, "2", cpus="100000")
                self.assertEqual(r.returncode, 2)
                self.assertIn("cannot pin to cores '100000'", r.stderr)


if __name__ == "__main__":
    unittest.main()
