#!/usr/bin/env python3
"""Tests of call_costs.py (standard library, no GPU): the calls and host time of the timed gpumem
runs are summed and divided, map+set_access is the sum of the two means, the other runs are left
out and counted, and bad input gets an error that names it."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import call_costs  # noqa: E402


def gpumem_run(workload, mode="gpumem", timed=1, **calls):
    stats = {"gpumem.driver.timed": timed}
    for name, (n, ns) in calls.items():
        stats["gpumem.driver.%s.calls" % name] = n
        stats["gpumem.driver.%s.ns" % name] = ns
    return {"workload": workload, "mode": mode, "status": "ok", "gpumem_stats": stats}


def write_jsonl(d, name, rows, extra=""):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
        f.write(extra)
    return path


class CallCosts(unittest.TestCase):
    def test_sums_over_timed_gpumem_runs_and_divides(self):
        with tempfile.TemporaryDirectory() as d:
            a = write_jsonl(d, "a.jsonl", [
                gpumem_run("w1", create=(2, 30000), map=(4, 8000), set_access=(4, 120000), unmap=(1, 20000)),
                {"workload": "w1", "mode": "native", "status": "ok"},  # not gpumem: left out
                gpumem_run("w1", mode="gpumem_trace", create=(0, 0), map=(2, 2000), set_access=(2, 80000),
                           unmap=(3, 100000)),
            ])
            b = write_jsonl(d, "b.jsonl", [
                gpumem_run("w2", timed=0, create=(100, 10**9)),  # a simulated source: left out
                {"workload": "w2", "mode": "gpumem", "status": "failed"},  # no gpumem_stats: left out
            ])
            runs, skipped = call_costs.load([a, b])
            self.assertEqual(len(runs), 2)
            self.assertEqual(skipped, 3)
            s = call_costs.summarize(runs)
            self.assertEqual(s["create"], (2, 30000))
            self.assertEqual(s["map"], (6, 10000))
            self.assertEqual(s["set_access"], (6, 200000))
            self.assertEqual(s["unmap"], (4, 120000))
            self.assertEqual(s["release"], (0, 0))
            self.assertEqual(s["map+set_access"], (6, 210000))
            self.assertAlmostEqual(call_costs.mean_us(*s["unmap"]), 30.0)
            self.assertAlmostEqual(call_costs.mean_us(*s["map+set_access"]), 35.0)
            self.assertIsNone(call_costs.mean_us(*s["release"]))
            out = subprocess.run([sys.executable, os.path.join(HERE, "call_costs.py"), a, b, "--by-workload"],
                                 capture_output=True, text=True, check=True).stdout
            self.assertIn("2 gpumem runs of 1 workloads (3 runs left out", out)
            self.assertRegex(out, r"unmap\s+4 calls\s+30\.0 us per call")
            self.assertRegex(out, r"map\+set_access\s+6 calls\s+35\.0 us per call")
            self.assertIn("w1 (2 runs):", out)
            j = json.loads(subprocess.run([sys.executable, os.path.join(HERE, "call_costs.py"), a, "--json"],
                                          capture_output=True, text=True, check=True).stdout)
            self.assertEqual(j["runs"], 2)
            self.assertAlmostEqual(j["all"]["set_access"]["mean_us"], 200000 / 1e3 / 6)

    def test_errors_name_the_problem(self):
        with tempfile.TemporaryDirectory() as d:
            bad = write_jsonl(d, "bad.jsonl", [gpumem_run("w", create=(1, 1000))], extra="{not json\n")
            p = subprocess.run([sys.executable, os.path.join(HERE, "call_costs.py"), bad], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("bad.jsonl:2 is not JSON", p.stderr)
            not_run = write_jsonl(d, "list.jsonl", [[1, 2]])
            p = subprocess.run([sys.executable, os.path.join(HERE, "call_costs.py"), not_run], capture_output=True,
                               text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("list.jsonl:1 is not a JSON object", p.stderr)
            empty = write_jsonl(d, "native.jsonl", [{"workload": "w", "mode": "native", "status": "ok"}])
            p = subprocess.run([sys.executable, os.path.join(HERE, "call_costs.py"), empty], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("no timed gpumem run with gpumem_stats in 1 file(s) (1 runs left out)", p.stderr)
            odd = gpumem_run("w", create=(1, 1000))
            odd["gpumem_stats"]["gpumem.driver.map.ns"] = "12"
            not_count = write_jsonl(d, "odd.jsonl", [gpumem_run("w", create=(1, 1000)), odd])
            for extra in ([], ["--engine-lock"]):
                if extra:
                    odd["gpumem_stats"]["gpumem.engine_lock.acquisitions"] = -3
                    not_count = write_jsonl(d, "odd.jsonl", [odd])
                p = subprocess.run([sys.executable, os.path.join(HERE, "call_costs.py"), not_count] + extra,
                                   capture_output=True, text=True)
                self.assertEqual(p.returncode, 1, p.stderr)
                self.assertNotIn("Traceback", p.stderr)
                self.assertIn("odd.jsonl:%d: gpumem_stats[" % (1 if extra else 2), p.stderr)
                self.assertIn("not a count", p.stderr)


class EngineLock(unittest.TestCase):
    def test_sums_per_workload_and_counts_caches(self):
        with tempfile.TemporaryDirectory() as d:
            def run(workload, acq, contended, on, mode="gpumem"):
                return {"workload": workload, "mode": mode, "status": "ok",
                        "gpumem_stats": {"gpumem.engine_lock.acquisitions": acq,
                                         "gpumem.engine_lock.contended": contended, "gpumem.thread_caches.on": on}}
            a = write_jsonl(d, "a.jsonl", [
                run("w1", 1000, 0, 0), run("w1", 500, 7, 1), run("w2", 40, 0, 0),
                {"workload": "w1", "mode": "native", "status": "ok"},  # not gpumem: left out
                gpumem_run("w2", create=(1, 1000)),  # no engine-lock counters: left out
            ])
            by_workload, skipped = call_costs.load_engine_lock([a])
            self.assertEqual(by_workload, {"w1": [2, 1500, 7, 1], "w2": [1, 40, 0, 0]})
            self.assertEqual(skipped, 2)
            script = os.path.join(HERE, "call_costs.py")
            out = subprocess.run([sys.executable, script, a, "--engine-lock"], capture_output=True, text=True,
                                 check=True).stdout
            self.assertIn("3 gpumem runs of 2 workloads with engine-lock counters (2 runs left out)", out)
            self.assertRegex(out, r"w1\s+2\s+1500\s+7\s+1")
            self.assertRegex(out, r"all\s+3\s+1540\s+7\s+1")
            j = json.loads(subprocess.run([sys.executable, script, a, "--engine-lock", "--json"], capture_output=True,
                                          text=True, check=True).stdout)
            self.assertEqual(j["all"], {"runs": 3, "acquisitions": 1540, "contended": 7, "thread_caches_on_runs": 1})
            self.assertEqual(j["by_workload"]["w2"]["acquisitions"], 40)
            none = write_jsonl(d, "none.jsonl", [gpumem_run("w", create=(1, 1000))])
            p = subprocess.run([sys.executable, script, none, "--engine-lock"], capture_output=True, text=True)
            self.assertNotEqual(p.returncode, 0)
            self.assertIn("no gpumem run with gpumem.engine_lock counters in 1 file(s) (1 runs left out)", p.stderr)


if __name__ == "__main__":
    unittest.main()
