#!/usr/bin/env python3
"""Tests of the GPU host's profiler on the CPU: libgpumem_sampler.so (bench/sampling_profiler.cpp)
from Python (ctypes) and preloaded, and scripts/gpu/profile_step.py's built-in alloc_loop on the
CPU, with its usage errors.

  python3 scripts/gpu/test_profile.py --sampler build/bench/libgpumem_sampler.so
"""

import argparse
import ctypes
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STEP = os.path.join(HERE, "profile_step.py")
SAMPLER = None

sys.path.insert(0, os.path.join(HERE, ".."))  # scripts/: unittest_status
from unittest_status import exit_status  # noqa: E402


def header_samples(text):
    m = re.search(r"^gpumem sampler: (\d+) samples", text, re.M)
    return int(m.group(1)) if m else None


def group_share(text, name):
    m = re.search(r"^ +\d+ +([0-9.]+)%% +%s " % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


class SamplerTest(unittest.TestCase):
    def test_ctypes_start_stop_report_of_a_busy_loop(self):
        # In a child: the sampler is process-wide (one timer, one handler).
        code = r"""
import ctypes, sys, time
s = ctypes.CDLL(sys.argv[1])
s.gpumem_sampler_start.argtypes = [ctypes.c_int, ctypes.c_long]
s.gpumem_sampler_stop.restype = ctypes.c_long
s.gpumem_sampler_report.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
assert s.gpumem_sampler_start(0, 10) != 0          # EINVAL: no rate
assert s.gpumem_sampler_start(997, 0) != 0         # EINVAL: no room
assert s.gpumem_sampler_start(997, 100000) == 0
assert s.gpumem_sampler_start(997, 100000) != 0    # EBUSY: already running
def busy_python_loop(seconds):
    t = time.process_time() + seconds
    x = 0
    while time.process_time() < t:
        x += sum(range(200))
    return x
busy_python_loop(0.6)
kept = s.gpumem_sampler_stop()
assert kept > 0, kept
assert s.gpumem_sampler_report(sys.argv[2].encode(), b"py=python|libpython;nothing=no_such_symbol_anywhere") == 0
assert s.gpumem_sampler_report(sys.argv[2].encode() + b".bad", b"no_equals_sign") != 0
print(kept)
"""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "r.txt")
            p = subprocess.run([sys.executable, "-c", code, SAMPLER, out], capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            self.assertIn("is not NAME=PATTERN", p.stderr)  # the malformed groups are named
            self.assertFalse(os.path.exists(out + ".bad"))
            text = open(out).read()
            n = header_samples(text)
            self.assertEqual(n, int(p.stdout.strip()))
            # 0.6 s of CPU at the kernel's tick (>= 100 Hz on any usual kernel): tens of samples.
            self.assertGreaterEqual(n, 20, text[:400])
            self.assertEqual(group_share(text, "py"), 100.0, text[:1200])  # every sample is under Python
            self.assertEqual(group_share(text, "nothing"), 0.0)
            self.assertIn("top symbols by inclusive samples", text)
            self.assertRegex(text, r"_PyEval_EvalFrameDefault|PyEval_EvalCode")

    def run_preloaded(self, cpu_s, **settings):
        """A Python child busy for cpu_s seconds of CPU with the sampler preloaded and
        GPUMEM_SAMPLER_* settings (OUT is set here). Returns (process, report text)."""
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "pre.txt")
            env = dict(os.environ, GPUMEM_SAMPLER_OUT=out, LD_PRELOAD=SAMPLER,
                       **{"GPUMEM_SAMPLER_" + k: v for k, v in settings.items()})
            code = "import time\nt=time.process_time()+%r\nwhile time.process_time()<t: sum(range(100))\n" % cpu_s
            p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(p.returncode, 0, p.stderr)
            return p, open(out).read()  # read even where stderr reports a bad setting: nothing lost

    def test_preloaded_into_a_program_writes_the_report_at_exit(self):
        _, text = self.run_preloaded(0.5, HZ="500")
        self.assertIn("at 500 Hz", text)
        self.assertGreaterEqual(header_samples(text), 10, text[:400])
        self.assertGreater(group_share(text, "Python interpreter"), 90.0)

    def test_preloaded_with_bad_groups_says_so_and_still_reports(self):
        p, text = self.run_preloaded(0.3, GROUPS="no_equals")
        self.assertIn("group 'no_equals' is not NAME=PATTERN", p.stderr)
        self.assertIn("reporting with the default groups", p.stderr)
        self.assertIsNotNone(group_share(text, "Python interpreter"))  # the run's samples are not lost

    def test_preloaded_with_a_bad_rate_says_so_and_keeps_the_default(self):
        p, text = self.run_preloaded(0.0, HZ="fast")
        self.assertIn("GPUMEM_SAMPLER_HZ=fast is not a rate in 1..100000; using 997", p.stderr)
        self.assertIn("at 997 Hz", text)


class ProfileStepTest(unittest.TestCase):
    def run_step(self, *args):
        return subprocess.run([sys.executable, STEP] + list(args), capture_output=True, text=True, timeout=300)

    def test_alloc_loop_on_the_cpu(self):
        try:
            import torch  # noqa: F401
        except ImportError:
            self.skipTest("torch is not importable by %s" % sys.executable)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "p.txt")
            p = self.run_step("--workload", "alloc_loop", "--mode", "native", "--device", "cpu",
                              "--sampler", SAMPLER, "--out", out, "--steps", "8", "--warmup", "1")
            self.assertEqual(p.returncode, 0, p.stderr)
            text = open(out).read()
            self.assertRegex(text.splitlines()[0], r"^profile_step: alloc_loop under native .* 8 timed step\(s\)")
            self.assertGreater(header_samples(text), 0, text[:600])
            self.assertGreater(group_share(text, "Python interpreter"), 50.0)
            self.assertEqual(group_share(text, "gpumem allocator"), 0.0)  # not loaded
            self.assertIn("c10::alloc_cpu", text)  # the CPU allocator's exported entry is seen

    def test_usage_errors_name_the_fix(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "p.txt")
            cases = [
                (["--workload", "alloc_loop", "--mode", "gpumem", "--sampler", SAMPLER, "--out", out],
                 "--mode gpumem needs --lib"),
                (["--workload", "alloc_loop", "--mode", "native", "--sampler", os.path.join(d, "none.so"), "--out", out],
                 "build the gpumem_sampler target"),
                (["--workload", "alloc_loop", "--mode", "native", "--sampler", SAMPLER, "--out", out, "--hz", "0"],
                 "--hz 0: give a rate in 1..100000"),
                (["--workload", "alloc_loop", "--mode", "native", "--sampler", SAMPLER, "--out", out, "--steps", "0"],
                 "--steps 0: give at least 1"),
                (["--workload", "alloc_loop", "--mode", "native", "--sampler", SAMPLER,
                  "--out", os.path.join(d, "no", "dir", "p.txt")], "does not exist"),
                (["--workload", "alloc_loop", "--mode", "native", "--device", "cpu", "--sampler", SAMPLER,
                  "--out", out, "--groups", "x=;y"], "--groups 'x=;y': give NAME=PATTERN"),
            ]
            for args, message in cases:
                p = self.run_step(*args)
                self.assertEqual(p.returncode, 2, (args, p.stderr))
                self.assertIn(message, p.stderr, args)
                self.assertFalse(os.path.exists(out))


def main():
    global SAMPLER
    ap = argparse.ArgumentParser()
    ap.add_argument("--sampler", required=True)
    args, rest = ap.parse_known_args()
    if not os.path.isfile(args.sampler):
        print("test_profile.py: --sampler %s does not exist" % args.sampler, file=sys.stderr)
        return 2
    SAMPLER = os.path.abspath(args.sampler)
    prog = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2)
    return exit_status(prog.result)


if __name__ == "__main__":
    sys.exit(main())
