#!/usr/bin/env python3
"""scripts/corpus_table.py's inputs: the known-over and step-markers files, and the replay command
it builds for a gpumem+plan column (ctest corpus_table)."""
import os
import subprocess
import sys
import tempfile

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
ROOT = os.path.join(SCRIPTS, "..")
sys.path.insert(0, SCRIPTS)
import corpus_table  # noqa: E402

failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


def exits(fn, *args):
    """The exit status fn(*args) ends with (None if it returns)."""
    try:
        fn(*args)
    except SystemExit as e:
        return e.code
    return None


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "markers.txt")
        with open(path, "w") as f:
            f.write("# a comment\n\nllama_train 1048576000 4  # the logits\nresnet50 314453136 1\n")
        m = corpus_table.load_step_markers(path)
        check(m == {"llama_train": (1048576000, 4), "resnet50": (314453136, 1)}, f"markers: {m}")
        for bad in ("x 1", "x 1 0", "x 0 1", "x one 1", "x 1 2 3"):
            with open(path, "w") as f:
                f.write(bad + "\n")
            check(exits(corpus_table.load_step_markers, path) == 2, f"bad markers line accepted: {bad!r}")
        check(exits(corpus_table.load_step_markers, os.path.join(d, "none.txt")) == 2, "missing markers file")
        known = os.path.join(d, "known.txt")
        with open(known, "w") as f:
            f.write("convnext_tiny_train 1.0003 # one granule\n")
        check(corpus_table.load_known_over(known) == {"convnext_tiny_train": 1.0003}, "known_over")
        with open(known, "w") as f:
            f.write("convnext_tiny_train\n")
        check(exits(corpus_table.load_known_over, known) == 2, "bad known_over line accepted")

    # The repository's markers file parses, and names traces of the corpus (or the shared ones).
    shipped = corpus_table.load_step_markers(os.path.join(ROOT, "traces", "corpus", "step_markers.txt"))
    corpus = {n[:-len(".trace.csv.gz")] for n in os.listdir(os.path.join(ROOT, "traces", "corpus", "native"))
              if n.endswith(".trace.csv.gz")}
    check(len(shipped) == 10, f"shipped markers: {sorted(shipped)}")
    check(set(shipped) - corpus <= {"resnet50", "vit"}, f"markers for unknown traces: {set(shipped) - corpus}")

    # The command for a column with the step planner (gpumem+plan, or gpumem, whose default has it): the
    # marks only when there is a marker, and only then.
    seen = []

    class Done:
        returncode = 0
        stdout = '{"policies": []}'
        stderr = ""

    real = subprocess.run
    subprocess.run = lambda args, **kw: seen.append(args) or Done()
    try:
        corpus_table.replay("gpumem", "t.csv.gz", ["gpumem+plan", "pytorch"], (1000, 4))
        corpus_table.replay("gpumem", "t.csv.gz", ["gpumem+plan", "pytorch"], None)
        corpus_table.replay("gpumem", "t.csv.gz", ["gpumem:step_plan:False", "pytorch"], (1000, 4))
        corpus_table.replay("gpumem", "t.csv.gz", ["gpumem", "pytorch"], (1000, 4))
    finally:
        subprocess.run = real
    check(seen[0][-4:] == ["--step-marker", "1000", "--per-step", "4"], f"marked: {seen[0]}")
    check("--step-marker" not in seen[1] and "gpumem+plan" in seen[1], f"detected: {seen[1]}")
    check("--step-marker" not in seen[2], f"no planner, no marks: {seen[2]}")
    check(seen[3][-4:] == ["--step-marker", "1000", "--per-step", "4"], f"the default plans, marked: {seen[3]}")
    check(corpus_table.is_plan("gpumem+plan:recycle:False") and corpus_table.is_plan("gpumem")
          and corpus_table.is_plan("gpumem:recycle:False") and not corpus_table.is_plan("gpumem:step_plan:False")
          and not corpus_table.is_plan("gpumem:recycle:False,step_plan:False") and not corpus_table.is_plan("pytorch"),
          "is_plan")

    for f in failures:
        print("FAILED:", f)
    print(f"test_corpus_table: {len(failures)} failed" if failures else "test_corpus_table: all passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
