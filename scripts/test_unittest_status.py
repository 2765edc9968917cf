#!/usr/bin/env python3
"""Tests of scripts/unittest_status.py: a driver whose cases were skipped exits
GPUMEM_SKIP_EXIT_CODE (ctest shows it as skipped), a failure exits 1, a clean run 0.

  python3 scripts/test_unittest_status.py
"""

import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))

DRIVER = textwrap.dedent("""
    import sys, unittest
    sys.path.insert(0, %r)
    from unittest_status import exit_status

    class T(unittest.TestCase):
        def test_runs(self):
            self.assertTrue(True)
        def test_maybe_skipped(self):
            if "skip" in sys.argv[1:]:
                self.skipTest("no widget here")
        def test_maybe_failing(self):
            self.assertNotIn("fail", sys.argv[1:])

    sys.exit(exit_status(unittest.main(argv=[sys.argv[0]], exit=False).result))
""") % HERE


class ExitStatusTest(unittest.TestCase):
    def run_driver(self, *args, skip_code=None):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "driver.py")
            with open(path, "w") as f:
                f.write(DRIVER)
            env = {k: v for k, v in os.environ.items() if k != "GPUMEM_SKIP_EXIT_CODE"}
            if skip_code is not None:
                env["GPUMEM_SKIP_EXIT_CODE"] = skip_code
            return subprocess.run([sys.executable, path] + list(args), env=env, capture_output=True, text=True,
                                  timeout=60)

    def test_all_ran(self):
        self.assertEqual(self.run_driver(skip_code="77").returncode, 0)

    def test_a_skip_under_ctest_shows_as_skipped_and_says_which(self):
        p = self.run_driver("skip", skip_code="77")
        self.assertEqual(p.returncode, 77, p.stderr)
        self.assertIn("SKIPPED: 1 case(s), nothing failed", p.stderr)
        self.assertIn("test_maybe_skipped: no widget here", p.stderr)

    def test_a_skip_by_hand_exits_0_and_still_says_so(self):
        p = self.run_driver("skip")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("SKIPPED: 1 case(s)", p.stderr)

    def test_a_failure_is_a_failure_even_beside_a_skip(self):
        self.assertEqual(self.run_driver("skip", "fail", skip_code="77").returncode, 1)


if __name__ == "__main__":
    unittest.main(verbosity=2)
