#!/usr/bin/env python3
"""Tests of scripts/gpu/stage.sh on the CPU: which files of a build tree it stages for the GPU
machine. A fake build tree holds copies of a real ELF executable (/bin/true) under the names the
rule tells apart; the archive goes to a temporary path (GPUMEM_STAGE_OUT), never .gpu/.

  python3 scripts/gpu/test_stage.py
"""

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
STAGE = os.path.join(HERE, "stage.sh")

sys.path.insert(0, os.path.join(HERE, ".."))  # scripts/: unittest_status
from unittest_status import exit_status  # noqa: E402

ELF = shutil.which("true") or "/bin/true"

# Path in the build tree -> staged or not.
LAYOUT = {
    "tests/allocator/test_memory_source": True,   # a GPU script (regression.sh) names it
    "tests/torch/torch_graph_pools": True,        # graphs.sh names it
    "tests/viewer/viewer_test_render": False,     # a CPU test no GPU script names
    "tests/allocator/test_free_index": False,     # likewise
    "tests/torch/package_consumer/prefix/lib/libgpumem_torch.so": False,  # an installed copy
    "fuzz-clang/fuzz/fuzz_csv": False,            # CPU-only fuzzers
    "bench/bench_alloc_pairs": True,              # not a test: always staged
    "torch/libgpumem_torch.so": True,
}


class StageTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpumem-stage-test-")
        self.build = os.path.join(self.tmp, "build")
        for rel in LAYOUT:
            path = os.path.join(self.build, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            shutil.copy(ELF, path)
            os.chmod(path, 0o755)
        # Neither ELF nor staged: a script beside the tests, and CMake's own files.
        os.makedirs(os.path.join(self.build, "tests/allocator/CMakeFiles"), exist_ok=True)
        with open(os.path.join(self.build, "tests/allocator/run.sh"), "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(os.path.join(self.build, "tests/allocator/run.sh"), 0o755)
        shutil.copy(ELF, os.path.join(self.build, "tests/allocator/CMakeFiles/test_memory_source"))
        self.out = os.path.join(self.tmp, "out", "build.tar.xz")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def stage(self):
        env = dict(os.environ, GPUMEM_STAGE_OUT=self.out)
        return subprocess.run(["bash", STAGE, self.build], env=env, capture_output=True, text=True, timeout=120)

    def test_stages_gpu_binaries_and_leaves_out_cpu_tests(self):
        r = self.stage()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with tarfile.open(self.out) as t:
            names = {os.path.normpath(n) for n in t.getnames()}
        for rel, staged in LAYOUT.items():
            self.assertEqual(rel in names, staged, "%s: staged %s, wanted %s" % (rel, rel in names, staged))
        self.assertNotIn("tests/allocator/run.sh", names)
        self.assertNotIn("tests/allocator/CMakeFiles/test_memory_source", names)
        # The count it prints: 4 staged, the 2 unnamed CPU tests left out.
        self.assertIn("stage: 4 binaries from %s (2 CPU-only test binaries left out)" % self.build, r.stdout)
        self.assertIn(self.out, r.stdout)

    def test_staged_binaries_are_stripped_and_still_run(self):
        r = self.stage()
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        unpacked = os.path.join(self.tmp, "unpacked")
        with tarfile.open(self.out) as t:
            t.extractall(unpacked)
        binary = os.path.join(unpacked, "bench/bench_alloc_pairs")
        self.assertEqual(subprocess.run([binary]).returncode, 0)
        self.assertNotIn("not stripped", subprocess.run(["file", binary], capture_output=True, text=True).stdout)

    def test_a_missing_build_directory_is_an_error(self):
        env = dict(os.environ, GPUMEM_STAGE_OUT=self.out)
        r = subprocess.run(["bash", STAGE, os.path.join(self.tmp, "nope")], env=env, capture_output=True,
                           text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertFalse(os.path.exists(self.out))


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=1).result
    sys.exit(exit_status(result))
