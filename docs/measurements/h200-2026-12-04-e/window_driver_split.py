# The Python loop of torch-window-driver-split.txt, run on the H200 from the repository root as
#   GPUMEM_ALLOC_CONF="" python3 window_driver_split.py W        (W = 64, 1024)
# (GPUMEM_ALLOC_CONF set, empty for the defaults, so that loading the library installs gpumem).
import math, random, sys, torch
torch.ops.load_library(".gpu/build/torch/libgpumem_torch.so")
W = int(sys.argv[1]); rng = random.Random(100); live = []
def size(): return int(math.exp(rng.uniform(math.log(512), math.log(32 << 20))))
dev = torch.device("cuda", 0)
def drv():
    s = torch.ops.gpumem.memory_stats(dev); return {k: int(v) for k, v in s.items() if k.startswith("gpumem.driver.") and (k.endswith(".calls") or k.endswith(".ns"))}
for _ in range(W): live.append(torch.empty(size(), dtype=torch.uint8, device="cuda"))
for i in range(20000): live.pop(0); live.append(torch.empty(size(), dtype=torch.uint8, device="cuda"))
a = drv(); N = 100000
for i in range(N): live.pop(0); live.append(torch.empty(size(), dtype=torch.uint8, device="cuda"))
b = drv()
print("window", W, "pairs", N, "backend", torch.cuda.get_allocator_backend(), "reserved GiB %.3f" % (torch.cuda.memory_reserved() / 2**30))
for k in sorted(b):
    d = b[k] - a.get(k, 0)
    if d and k.endswith("calls"): print("  %-32s %8d  (%.1f per 1000 pairs)" % (k, d, d * 1000 / N))
    elif d: print("  %-32s %9.1f ms  (%.1f ns per pair, %.1f us per call)" % (k, d / 1e6, d / N, d / 1e3 / max(1, b[k[:-3] + ".calls"] - a.get(k[:-3] + ".calls", 0))))
