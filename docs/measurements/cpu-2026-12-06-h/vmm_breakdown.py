"""Where each trace's replayed driver time goes: building the footprint (a create and a map per
piece created) against moving pieces (a map per piece moved, an unmap per piece unmapped), beside
the call counts and the average length of a created piece. Session 37's measurement script.

    python3 vmm_breakdown.py GPUMEM_BINARY TRACE_DIR... [--policy P]...

The per-call costs are forensics/offline/include/gpumem/forensics/call_costs.h's (kH200VmmCosts);
syncs and marker waits are the rest of the share (not split here)."""
import argparse, glob, json, os, re, subprocess

CREATE_US, MAP_US, UNMAP_US = 14.5, 1.9 + 32.2, 29.2  # call_costs.h

ap = argparse.ArgumentParser()
ap.add_argument("gpumem")
ap.add_argument("dirs", nargs="+", help="corpus directories (their native/*.trace.csv.gz)")
ap.add_argument("--policy", action="append", default=[])
a = ap.parse_args()
policies = a.policy or ["gpumem", "pytorch:expandable"]
print(f"{'trace':28s} {'policy':20s} {'ratio':>7s} {'share':>6s} {'creates':>7s} {'MiB/piece':>9s} {'build':>6s} "
      f"{'moved':>6s} {'moves':>6s} {'unmaps':>6s} {'syncs':>5s} {'arena ms':>8s}")
for d in a.dirs:
    for t in sorted(glob.glob(os.path.join(d, "native", "*.trace.csv.gz"))):
        args = [a.gpumem, "replay", t, "--json", "--top", "0"]
        for p in policies:
            args += ["--policy", p]
        r = json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
        dur = r["duration_us"] * 1e-6
        for p in r["policies"]:
            run = dur + p["call_seconds"]
            moved = p["maps"] - p["creates"]
            build = p["creates"] * (CREATE_US + MAP_US) * 1e-6 / run
            moves = (moved * MAP_US + p["unmaps"] * UNMAP_US) * 1e-6 / run
            mib = p["peak_reserved_bytes"] / 2**20 / max(p["creates"], 1)
            m = re.search(r"first arena took ([0-9.]+) ms", p.get("notes", ""))
            print(f"{os.path.basename(t).split('.')[0][:28]:28s} {p['policy'][:20]:20s} {p['ratio']:7.4f} "
                  f"{100 * p['call_share']:5.2f}% {p['creates']:7d} {mib:9.2f} {100 * build:5.2f}% {moved:6d} "
                  f"{100 * moves:5.2f}% {p['unmaps']:6d} {p['syncs']:5d} {m.group(1) if m else '-':>8s}")
