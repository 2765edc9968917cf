"""Medians of this folder's runs: python3 summarize.py (prints engine-alone and torch pairs tables)."""
import os
import re
import statistics as st

here = os.path.dirname(os.path.abspath(__file__))


def engine(path):
    rows, peaks, cur = {}, {}, None
    for line in open(path):
        m = re.match(r"== (\S+) threads (\d+) run (\d+)", line)
        if m:
            cur = (m.group(1), int(m.group(2)))
            continue
        m = re.match(r"(4 KiB|window 64|window 1024)\S*.*?\s([\d.]+) \([\d.]+\.\.[\d.]+\)\s+([\d.]+) \(", line)
        if m and cur:
            rows.setdefault((cur, m.group(1)), []).append((float(m.group(2)), float(m.group(3))))
            p = re.search(r"\d threads: .*?peak (\d+) MiB", line)
            peaks.setdefault((cur, m.group(1)), []).append(int(p.group(1)))
    print("engine alone (bench_alloc_pairs): median (min..max) over the runs of each run's median, ns per pair (per thread)")
    for (k, p), v in sorted(rows.items()):
        one = [a for a, _ in v]
        many = [b for _, b in v]
        pk = peaks[(k, p)]
        print(f"{k[0]:<24} {k[1]}t {p:<12} 1 thread {st.median(one):6.1f} ({min(one):.1f}..{max(one):.1f})"
              f"  {k[1]} threads {st.median(many):6.1f} ({min(many):.1f}..{max(many):.1f})"
              f"  peak {st.median(pk):.0f} MiB ({min(pk)}..{max(pk)})  runs {len(v)}")


def torch_pairs(path):
    rows, peaks, cur = {}, {}, None
    for line in open(path):
        m = re.match(r"== (\S+) run (\d+)", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"(4 KiB|1 MiB|64 MiB|window 64|window 1024)\S*.*?\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)x",
                     line)
        if m and cur:
            rows.setdefault((m.group(1), cur), []).append((float(m.group(4)), float(m.group(6))))
        m = re.search(r"peak reserved (\d+) MiB", line)
        if m and cur:
            peaks.setdefault(cur, []).append(int(m.group(1)))
    print("through libtorch (torch_alloc_pairs): 1-thread speed-up over native, 4-thread gpumem ns per pair per thread")
    for (p, k), v in rows.items():
        a = [x for x, _ in v]
        b = [y for _, y in v]
        print(f"{p:<12} {k:<5} 1 thread {st.median(a):.2f}x ({min(a):.2f}..{max(a):.2f})"
              f"  4 threads {st.median(b):6.1f} ({min(b):.1f}..{max(b):.1f})  runs {len(v)}")
    for k, v in peaks.items():
        print(f"{k}: peak reserved per process, MiB: {v}")


engine(os.path.join(here, "caches-help.txt"))
print()
torch_pairs(os.path.join(here, "torch-pairs.txt"))
