// cuda_vmm_groups: what building memory in long physical handles would cost, measured with the CUDA
// driver's virtual memory calls directly (CudaVmmSource maps whole handles only).
//
// The replay's whole-run VMM share is bounded below by the number of pieces a footprint needs
// (docs/notes/allocation-policy.md, "How far the whole-run VMM share can go"): every piece is one
// cuMemCreate, one cuMemMap and one cuMemSetAccess. This program measures the premises of building
// a footprint in long handles instead, each mapped by one call, with the parts that recycling moves
// mapped a second time elsewhere:
//
//   build      TOTAL MiB as handles of 2, 8, 64 and 512 MiB: create + map + set access per handle,
//              then unmap + release; microseconds per call and per GiB built.
//   alias      a part of a mapped handle (2 MiB at an offset) mapped a second time at another
//              address while the whole mapping stays: the driver's answer, and when it accepts, the
//              cost and whether bytes written through one address read back through the other.
//   part unmap cuMemUnmap of 2 MiB inside a 64 MiB mapping: the driver's answer.
//   in parts   one 64 MiB handle mapped in parts of 2 MiB (offsets 0 and 2 MiB): the answers.
//
// A refusal is a finding, printed with the driver's error name; the exit status is 1 only when a
// call that must work fails (or aliased bytes do not read back).
//
//   cuda_vmm_groups [--device N] [--rounds R] [--total-mib M]
#include <cuda.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "bench_args.h"

namespace {

// One driver entry point, looked up through cudart when constructed (nothing links libcuda); a
// symbol not found is added to `missing` and leaves the entry null.
template <class Fn>
struct Entry {
  Fn fn = nullptr;
  Entry(const char* symbol, std::string& missing) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion(symbol, &p, 12000, cudaEnableDefault, &query) != cudaSuccess ||
        query != cudaDriverEntryPointSuccess || p == nullptr) {
      (void)cudaGetLastError();
      missing += missing.empty() ? symbol : fmt::format(", {}", symbol);
      return;
    }
    fn = reinterpret_cast<Fn>(p);
  }
  template <class... A>
  CUresult operator()(A... a) const {
    return fn(a...);
  }
};

// The entry points this program calls.
struct Driver {
  std::string missing;  // the symbols not found (declared first: the entries below append to it)
  Entry<decltype(&::cuGetErrorName)> get_error_name{"cuGetErrorName", missing};
  Entry<decltype(&::cuMemGetAllocationGranularity)> mem_get_allocation_granularity{"cuMemGetAllocationGranularity",
                                                                                   missing};
  Entry<decltype(&::cuMemAddressReserve)> mem_address_reserve{"cuMemAddressReserve", missing};
  Entry<decltype(&::cuMemAddressFree)> mem_address_free{"cuMemAddressFree", missing};
  Entry<decltype(&::cuMemCreate)> mem_create{"cuMemCreate", missing};
  Entry<decltype(&::cuMemRelease)> mem_release{"cuMemRelease", missing};
  Entry<decltype(&::cuMemMap)> mem_map{"cuMemMap", missing};
  Entry<decltype(&::cuMemUnmap)> mem_unmap{"cuMemUnmap", missing};
  Entry<decltype(&::cuMemSetAccess)> mem_set_access{"cuMemSetAccess", missing};

  std::string error_name(CUresult r) const {
    const char* s = nullptr;
    if (get_error_name.fn != nullptr && get_error_name(r, &s) == CUDA_SUCCESS && s != nullptr) return s;
    return fmt::format("CUresult {}", static_cast<int>(r));
  }
};

constexpr std::size_t kMiB = std::size_t{1} << 20;

struct Args {
  int device = 0;
  int rounds = 3;
  int total_mib = 2048;
};

// Microseconds per call of one kind: every call timed alone.
struct CallTime {
  std::uint64_t calls = 0;
  double total_us = 0;
  double mean() const { return calls ? total_us / static_cast<double>(calls) : 0.0; }
};

class Probe {
 public:
  explicit Probe(int device) : device_(device) {}

  // Empty when the driver and device are usable; otherwise why not.
  std::string init() {
    if (!d_.missing.empty()) return "the CUDA driver's virtual memory calls are missing: " + d_.missing;
    if (cudaSetDevice(device_) != cudaSuccess || cudaFree(nullptr) != cudaSuccess)
      return fmt::format("device {} cannot be made current", device_);
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = device_;
    access_.location = prop_.location;
    access_.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (CUresult r = d_.mem_get_allocation_granularity(&granularity_, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        r != CUDA_SUCCESS)
      return "cuMemGetAllocationGranularity failed: " + d_.error_name(r);
    return {};
  }
  std::size_t granularity() const { return granularity_; }

  // Each call below times itself into `t` and returns false (after printing the failure) when
  // the driver refuses.
  bool create(std::size_t bytes, CUmemGenericAllocationHandle& h, CallTime& t) {
    return timed("cuMemCreate", t, [&] { return d_.mem_create(&h, bytes, &prop_, 0); });
  }
  bool map(CUdeviceptr va, std::size_t bytes, std::size_t offset, CUmemGenericAllocationHandle h, CallTime& t) {
    return timed("cuMemMap", t, [&] { return d_.mem_map(va, bytes, offset, h, 0); });
  }
  bool set_access(CUdeviceptr va, std::size_t bytes, CallTime& t) {
    return timed("cuMemSetAccess", t, [&] { return d_.mem_set_access(va, bytes, &access_, 1); });
  }
  bool unmap(CUdeviceptr va, std::size_t bytes, CallTime& t) {
    return timed("cuMemUnmap", t, [&] { return d_.mem_unmap(va, bytes); });
  }
  bool release(CUmemGenericAllocationHandle h, CallTime& t) {
    return timed("cuMemRelease", t, [&] { return d_.mem_release(h); });
  }
  // The driver's answers, not treated as failures: cuMemMap (timed when accepted) and cuMemUnmap.
  CUresult try_map(CUdeviceptr va, std::size_t bytes, std::size_t offset, CUmemGenericAllocationHandle h, CallTime& t) {
    return time_call(nullptr, t, [&] { return d_.mem_map(va, bytes, offset, h, 0); });
  }
  CUresult try_unmap(CUdeviceptr va, std::size_t bytes) { return d_.mem_unmap(va, bytes); }
  std::string name(CUresult r) const { return d_.error_name(r); }

  bool reserve(std::size_t bytes, CUdeviceptr& va) {
    CUresult r = d_.mem_address_reserve(&va, bytes, 0, 0, 0);
    if (r != CUDA_SUCCESS) std::fprintf(stderr, "cuda_vmm_groups: cuMemAddressReserve of %zu bytes failed: %s\n", bytes,
                                        d_.error_name(r).c_str());
    return r == CUDA_SUCCESS;
  }
  void free_range(CUdeviceptr va, std::size_t bytes) { (void)d_.mem_address_free(va, bytes); }

 private:
  // A call that must work: false (after printing the failure) when the driver refuses.
  template <class F>
  bool timed(const char* what, CallTime& t, F&& call) {
    return time_call(what, t, call) == CUDA_SUCCESS;
  }
  // Times `call` into t when it succeeds, or always when `what` names it (a call that must work,
  // whose failure is printed); returns the driver's answer.
  template <class F>
  CUresult time_call(const char* what, CallTime& t, F&& call) {
    const auto t0 = std::chrono::steady_clock::now();
    const CUresult r = call();
    if (r == CUDA_SUCCESS || what != nullptr) {
      t.total_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
      ++t.calls;
    }
    if (r != CUDA_SUCCESS && what != nullptr)
      std::fprintf(stderr, "cuda_vmm_groups: %s failed: %s\n", what, d_.error_name(r).c_str());
    return r;
  }

  Driver d_;
  int device_;
  CUmemAllocationProp prop_{};
  CUmemAccessDesc access_{};
  std::size_t granularity_ = 0;
};

Args parse_args(int argc, char** argv) {
  Args a;
  gpumem::bench::BenchArgs args("cuda_vmm_groups", "[--device N] [--rounds R] [--total-mib M]");
  args.number("--device", a.device, 0, 1024).number("--rounds", a.rounds, 1, 1000).number("--total-mib", a.total_mib, 512,
                                                                                            1 << 20);
  args.parse(argc, argv);
  return a;
}

// TOTAL MiB built as handles of `piece` bytes, `rounds` times.
bool build(Probe& p, std::size_t total, std::size_t piece, int rounds) {
  const std::size_t n = total / piece;
  CUdeviceptr base = 0;
  if (!p.reserve(n * piece, base)) return false;
  std::vector<CUmemGenericAllocationHandle> h(n);
  CallTime create, map, access, unmap, release;
  double build_us = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (std::size_t i = 0; i < n; ++i) {
      if (!p.create(piece, h[i], create) || !p.map(base + i * piece, piece, 0, h[i], map) ||
          !p.set_access(base + i * piece, piece, access))
        return false;
    }
    build_us += std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    for (std::size_t i = 0; i < n; ++i)
      if (!p.unmap(base + i * piece, piece, unmap) || !p.release(h[i], release)) return false;
  }
  p.free_range(base, n * piece);
  const double gib = static_cast<double>(n * piece) / static_cast<double>(1ull << 30);
  std::printf("  %5zu MiB x %5zu   %9.1f %9.1f %9.1f %9.1f %9.1f   %10.1f\n", piece / kMiB, n, create.mean(), map.mean(),
              access.mean(), unmap.mean(), release.mean(), build_us / rounds / gib);
  return true;
}

std::string answer(Probe& p, CUresult r) { return r == CUDA_SUCCESS ? "accepted" : "refused, " + p.name(r); }

// A 64 MiB handle mapped whole; then 2 MiB of it at offset 10 MiB mapped a second time elsewhere,
// and 2 MiB inside the whole mapping unmapped.
bool alias_and_part_unmap(Probe& p, int rounds) {
  const std::size_t whole = 64 * kMiB, part = 2 * kMiB, offset = 10 * kMiB;
  CUdeviceptr a = 0, b = 0;
  if (!p.reserve(whole, a) || !p.reserve(part, b)) return false;
  CallTime create, map_whole, access_whole, map_part, access_part, unmap, release;
  bool aliased = true;
  CUresult part_map = CUDA_SUCCESS, part_unmap = CUDA_SUCCESS;
  std::vector<unsigned char> host(part);
  for (int r = 0; r < rounds; ++r) {
    CUmemGenericAllocationHandle h{};
    if (!p.create(whole, h, create) || !p.map(a, whole, 0, h, map_whole) || !p.set_access(a, whole, access_whole))
      return false;
    part_map = p.try_map(b, part, offset, h, map_part);
    if (part_map == CUDA_SUCCESS) {
      if (!p.set_access(b, part, access_part)) return false;
      // Bytes written through one address read back through the other, both ways.
      for (const auto& [to, from, byte] : {std::tuple{a + offset, b, 0x5A}, std::tuple{b, a + offset, 0x3C}}) {
        if (cudaMemset(reinterpret_cast<void*>(to), byte, part) != cudaSuccess ||
            cudaMemcpy(host.data(), reinterpret_cast<void*>(from), part, cudaMemcpyDeviceToHost) != cudaSuccess) {
          std::fprintf(stderr, "cuda_vmm_groups: memset/memcpy through the two mappings failed\n");
          return false;
        }
        aliased = aliased && std::all_of(host.begin(), host.end(), [&](unsigned char c) { return c == byte; });
      }
      if (!p.unmap(b, part, unmap)) return false;
    }
    part_unmap = p.try_unmap(a + offset, part);
    // Whatever the answer, give everything back (if the partial unmap was accepted, the rest of the
    // whole mapping is unmapped in two calls).
    if (part_unmap == CUDA_SUCCESS) {
      if (!p.unmap(a, offset, unmap) || !p.unmap(a + offset + part, whole - offset - part, unmap)) return false;
    } else if (!p.unmap(a, whole, unmap)) {
      return false;
    }
    if (!p.release(h, release)) return false;
  }
  p.free_range(a, whole);
  p.free_range(b, part);
  std::printf("\na 64 MiB handle mapped whole, %d rounds: cuMemCreate %.1f, cuMemMap %.1f, cuMemSetAccess %.1f us\n",
              rounds, create.mean(), map_whole.mean(), access_whole.mean());
  std::printf("  cuMemMap of 2 MiB of it at offset 10 MiB, elsewhere, the whole mapping in place: %s\n",
              answer(p, part_map).c_str());
  if (part_map == CUDA_SUCCESS)
    std::printf("    cuMemMap %.1f, cuMemSetAccess %.1f us; bytes written through either address read back through "
                "the other: %s\n",
                map_part.mean(), access_part.mean(), aliased ? "yes" : "NO");
  std::printf("  cuMemUnmap of 2 MiB inside the 64 MiB mapping: %s\n", answer(p, part_unmap).c_str());
  return aliased;
}

// One 64 MiB handle mapped in parts of 2 MiB at consecutive addresses: the first part (offset 0),
// then the second (offset 2 MiB).
bool in_parts(Probe& p) {
  const std::size_t whole = 64 * kMiB, part = 2 * kMiB;
  CUdeviceptr a = 0;
  if (!p.reserve(whole, a)) return false;
  CallTime create, map, release, unmap;
  CUmemGenericAllocationHandle h{};
  if (!p.create(whole, h, create)) return false;
  const CUresult first = p.try_map(a, part, 0, h, map);
  const CUresult second = p.try_map(a + part, part, part, h, map);
  if (second == CUDA_SUCCESS && !p.unmap(a + part, part, unmap)) return false;
  if (first == CUDA_SUCCESS && !p.unmap(a, part, unmap)) return false;
  if (!p.release(h, release)) return false;
  p.free_range(a, whole);
  std::printf("\na 64 MiB handle mapped in parts of 2 MiB: the part at offset 0 %s; the part at offset 2 MiB %s\n",
              answer(p, first).c_str(), answer(p, second).c_str());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse_args(argc, argv);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::fprintf(stderr, "cuda_vmm_groups: no CUDA device is present; run this on a machine with a GPU\n");
    return 1;
  }
  if (args.device >= count) {
    std::fprintf(stderr, "cuda_vmm_groups: --device %d is out of range: use 0..%d\n", args.device, count - 1);
    return 2;
  }
  Probe p(args.device);
  if (std::string why = p.init(); !why.empty()) {
    std::fprintf(stderr, "cuda_vmm_groups: %s\n", why.c_str());
    return 1;
  }
  const std::size_t total = static_cast<std::size_t>(args.total_mib) * kMiB;
  std::printf("device %d, granularity %zu bytes; %d MiB built per size, %d rounds (the first includes the warm-up)\n",
              args.device, p.granularity(), args.total_mib, args.rounds);
  std::printf("  handle x count   create_us    map_us access_us  unmap_us release_us  build_us_per_GiB\n");
  bool ok = true;
  for (std::size_t mib : {2, 8, 64, 512})
    if (static_cast<std::size_t>(args.total_mib) >= mib) ok = build(p, total, mib * kMiB, args.rounds) && ok;
  ok = alias_and_part_unmap(p, args.rounds) && ok;
  ok = in_parts(p) && ok;
  return ok ? 0 : 1;
}
