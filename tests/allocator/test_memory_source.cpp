// MemorySource conformance: one set of checks, written once in run_conformance(), run against every
// source: SimSource (with and without virtual memory), HostVmmSource and, tagged [gpu], the CUDA
// sources (skipped when no CUDA device is present). Then the checks only one source can answer.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/forwarding_source.h"
#include "gpumem/alloc/host_vmm_source.h"
#include "gpumem/alloc/memory_source.h"
#include "gpumem/alloc/sim_source.h"

#if defined(GPUMEM_HAVE_CUDA)
#include <cuda_runtime_api.h>

#include "gpumem/alloc/cuda_sources.h"
#endif

namespace Catch {
template <>
struct StringMaker<gpumem::alloc::SourceStatus> {
  static std::string convert(gpumem::alloc::SourceStatus status) { return gpumem::alloc::to_string(status); }
};
}  // namespace Catch

namespace {

using namespace gpumem::alloc;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// The operations a fault can be injected into (SimSource::Op and HostVmmSource::Op have these names).
enum class FaultOp { reserve, create, map, unmap, release, destroy };

// How the suite drives one kind of source.
struct SourceUnderTest {
  std::string name;
  std::function<std::unique_ptr<MemorySource>()> make;
  // A source whose physical capacity is capacity_bytes (CPU sources); null for real devices, where
  // the suite asks for more than the device has instead.
  std::function<std::unique_ptr<MemorySource>(std::size_t capacity_bytes)> make_with_capacity;
  // Makes the nth call of op fail with fault_injected; null if the source cannot.
  std::function<void(MemorySource&, FaultOp, std::uint64_t)> fail_nth;
  // Writes a pattern derived from seed over [va, va + size) / reads it back and compares;
  // null where memory cannot be touched (SimSource's fake addresses).
  std::function<void(std::uintptr_t, std::size_t, std::uint64_t)> write_pattern;
  std::function<bool(std::uintptr_t, std::size_t, std::uint64_t)> pattern_matches;
  int thread_iterations = 200;
};

template <class Source>
std::function<void(MemorySource&, FaultOp, std::uint64_t)> fault_injector() {
  return [](MemorySource& source, FaultOp op, std::uint64_t nth) {
    static_cast<Source&>(source).fail_nth(static_cast<typename Source::Op>(op), nth);
  };
}

std::uint64_t pattern_word(std::uint64_t seed, std::uint64_t index) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + index + 1;  // splitmix64 of (seed, index)
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

std::vector<std::uint64_t> make_pattern(std::size_t size_bytes, std::uint64_t seed) {
  std::vector<std::uint64_t> words(size_bytes / sizeof(std::uint64_t));
  for (std::size_t i = 0; i < words.size(); ++i) words[i] = pattern_word(seed, i);
  return words;
}

void host_write_pattern(std::uintptr_t va, std::size_t size_bytes, std::uint64_t seed) {
  auto* words = reinterpret_cast<std::uint64_t*>(va);
  for (std::size_t i = 0; i < size_bytes / sizeof(std::uint64_t); ++i) words[i] = pattern_word(seed, i);
}

bool host_pattern_matches(std::uintptr_t va, std::size_t size_bytes, std::uint64_t seed) {
  const auto* words = reinterpret_cast<const std::uint64_t*>(va);
  for (std::size_t i = 0; i < size_bytes / sizeof(std::uint64_t); ++i)
    if (words[i] != pattern_word(seed, i)) return false;
  return true;
}

std::size_t round_up(std::size_t x, std::size_t g) { return (x + g - 1) / g * g; }

// Passes every call through and attaches each failure's last_error() to the next assertion, so a
// failed check shows what the source said (only printed when that assertion fails).
class TracedSource final : public ForwardingSource {
 public:
  explicit TracedSource(MemorySource& inner) : ForwardingSource(inner) {}
  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override {
    auto r = ForwardingSource::reserve(size_bytes, alignment_bytes);
    note("reserve", r.status);
    return r;
  }
  SourceStatus release(VaRange range) override { return note("release", ForwardingSource::release(range)); }
  SourceResult<PhysHandle> create(std::size_t size_bytes) override {
    auto r = ForwardingSource::create(size_bytes);
    note("create", r.status);
    return r;
  }
  SourceStatus destroy(PhysHandle handle) override { return note("destroy", ForwardingSource::destroy(handle)); }
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override {
    return note("map", ForwardingSource::map(va, size_bytes, handle));
  }
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override {
    return note("unmap", ForwardingSource::unmap(va, size_bytes));
  }

 private:
  SourceStatus note(const char* op, SourceStatus status) {
    if (status != SourceStatus::ok) {
      UNSCOPED_INFO(op << " -> " << to_string(status) << ": " << ForwardingSource::last_error());
    }
    return status;
  }
};

// ---- The conformance checks ----

void check_caps_and_mem_info(MemorySource& source) {
  const SourceCaps caps = source.caps();
  CHECK(std::string(caps.name).size() > 0);
  REQUIRE(caps.granularity_bytes > 0);
  const ProviderMemInfo info = source.mem_info();
  CHECK(info.total_bytes > 0);
  CHECK(info.free_bytes <= info.total_bytes);
}

void check_reserve_release(MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  auto a = source.reserve(g, 0);
  REQUIRE(a.ok());
  CHECK(a.value.size_bytes == g);
  CHECK(a.value.base != 0);
  CHECK(a.value.base % g == 0);
  auto b = source.reserve(4 * g, 8 * g);
  REQUIRE(b.ok());
  CHECK(b.value.size_bytes == 4 * g);
  CHECK(b.value.base % (8 * g) == 0);
  CHECK((a.value.end() <= b.value.base || b.value.end() <= a.value.base));  // disjoint

  // Only exactly what reserve() returned can be released, and only once.
  CHECK(source.release(VaRange{b.value.base, 2 * g}) == SourceStatus::invalid_argument);
  CHECK(source.release(VaRange{b.value.base + g, g}) == SourceStatus::invalid_argument);
  CHECK_FALSE(source.last_error().empty());
  CHECK(source.release(a.value) == SourceStatus::ok);
  CHECK(source.release(a.value) == SourceStatus::invalid_argument);
  CHECK(source.release(b.value) == SourceStatus::ok);
}

void check_misaligned_sizes(MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  for (std::size_t size : {std::size_t{0}, g / 2, g + 1, g + g / 2}) {
    INFO("size " << size);
    auto r = source.reserve(size, 0);
    CHECK(r.status == SourceStatus::invalid_argument);
    CHECK_FALSE(source.last_error().empty());
    if (source.caps().virtual_memory) {
      auto c = source.create(size);
      CHECK(c.status == SourceStatus::invalid_argument);
    }
  }
  // Nothing was left behind: a valid call still works.
  auto r = source.reserve(g, 0);
  REQUIRE(r.ok());
  CHECK(source.release(r.value) == SourceStatus::ok);
}

void check_no_virtual_memory(MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  auto r = source.reserve(2 * g, 0);
  REQUIRE(r.ok());  // the range is backed: one segment
  CHECK(source.create(g).status == SourceStatus::unsupported);
  CHECK_FALSE(source.last_error().empty());
  CHECK(source.map(r.value.base, g, 1) == SourceStatus::unsupported);
  CHECK(source.unmap(r.value.base, g) != SourceStatus::ok);
  CHECK(source.destroy(1) != SourceStatus::ok);
  CHECK(source.release(r.value) == SourceStatus::ok);
}

void check_piece_lifecycle(MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  auto r = source.reserve(4 * g, 0);
  REQUIRE(r.ok());
  const std::uintptr_t base = r.value.base;
  auto h = source.create(g);
  REQUIRE(h.ok());

  REQUIRE(source.map(base, g, h.value) == SourceStatus::ok);
  // An alias: the same piece at a second address (the engine's kept mappings), the same memory.
  REQUIRE(source.map(base + g, g, h.value) == SourceStatus::ok);
  if (source.caps().host_accessible) {
    *reinterpret_cast<volatile unsigned char*>(base + 17) = 0xa7;
    CHECK(*reinterpret_cast<volatile unsigned char*>(base + g + 17) == 0xa7);
  }
  CHECK(source.map(base + g, g, h.value) == SourceStatus::invalid_argument);  // that address is taken
  CHECK(source.destroy(h.value) == SourceStatus::invalid_argument);           // still mapped (twice)
  REQUIRE(source.unmap(base + g, g) == SourceStatus::ok);                     // one mapping goes
  CHECK(source.destroy(h.value) == SourceStatus::invalid_argument);           // still mapped (once)
  CHECK(source.release(r.value) == SourceStatus::invalid_argument);           // a piece is mapped inside
  CHECK(source.unmap(base + g, g) == SourceStatus::invalid_argument);         // nothing mapped there
  CHECK(source.unmap(base, 2 * g) == SourceStatus::invalid_argument);         // not what map() mapped
  REQUIRE(source.unmap(base, g) == SourceStatus::ok);
  CHECK(source.unmap(base, g) == SourceStatus::invalid_argument);             // twice

  // The same piece maps again at another address.
  REQUIRE(source.map(base + 3 * g, g, h.value) == SourceStatus::ok);
  REQUIRE(source.unmap(base + 3 * g, g) == SourceStatus::ok);

  // A piece of several granules maps whole and only where it fits.
  auto big = source.create(2 * g);
  REQUIRE(big.ok());
  CHECK(source.map(base + 3 * g, 2 * g, big.value) == SourceStatus::invalid_argument);  // runs past the range
  CHECK(source.map(base + 2 * g, g, big.value) == SourceStatus::invalid_argument);      // not the whole piece
  REQUIRE(source.map(base + 2 * g, 2 * g, big.value) == SourceStatus::ok);
  REQUIRE(source.map(base, g, h.value) == SourceStatus::ok);  // next to it
  CHECK(source.unmap(base + 2 * g, 2 * g) == SourceStatus::ok);
  CHECK(source.unmap(base, g) == SourceStatus::ok);

  CHECK(source.destroy(big.value) == SourceStatus::ok);
  CHECK(source.destroy(h.value) == SourceStatus::ok);
  CHECK(source.destroy(h.value) == SourceStatus::invalid_argument);  // twice
  CHECK(source.release(r.value) == SourceStatus::ok);
}

void check_misuse(MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  auto r = source.reserve(4 * g, 0);
  REQUIRE(r.ok());
  const std::uintptr_t base = r.value.base;
  auto one = source.create(g);
  auto two = source.create(2 * g);
  REQUIRE(one.ok());
  REQUIRE(two.ok());

  const PhysHandle unknown = ~PhysHandle{0};
  CHECK(source.map(base, g, unknown) == SourceStatus::invalid_argument);
  CHECK_FALSE(source.last_error().empty());
  CHECK(source.destroy(unknown) == SourceStatus::invalid_argument);
  CHECK(source.unmap(base, g) == SourceStatus::invalid_argument);             // unmapped va
  CHECK(source.map(base + g / 2, g, one.value) == SourceStatus::invalid_argument);  // misaligned va
  CHECK(source.map(base, 2 * g, one.value) == SourceStatus::invalid_argument);      // size != piece size
  CHECK(source.map(g, g, one.value) == SourceStatus::invalid_argument);              // not reserved here

  // Overlap with an existing mapping, from either side.
  REQUIRE(source.map(base + g, 2 * g, two.value) == SourceStatus::ok);
  CHECK(source.map(base + 2 * g, g, one.value) == SourceStatus::invalid_argument);
  CHECK(source.map(base + g, g, one.value) == SourceStatus::invalid_argument);
  CHECK(source.destroy(two.value) == SourceStatus::invalid_argument);  // destroy while mapped
  CHECK(source.map(base, g, one.value) == SourceStatus::ok);           // the free granule before it is fine

  // A destroyed handle is unknown.
  CHECK(source.unmap(base, g) == SourceStatus::ok);
  CHECK(source.destroy(one.value) == SourceStatus::ok);
  CHECK(source.map(base, g, one.value) == SourceStatus::invalid_argument);

  CHECK(source.unmap(base + g, 2 * g) == SourceStatus::ok);
  CHECK(source.destroy(two.value) == SourceStatus::ok);
  CHECK(source.release(r.value) == SourceStatus::ok);
}

void check_capacity(const SourceUnderTest& kind) {
  if (kind.make_with_capacity) {
    auto probe = kind.make();
    const std::size_t g = probe->caps().granularity_bytes;
    auto owned = kind.make_with_capacity(4 * g);
    auto source = std::make_unique<TracedSource>(*owned);
    CHECK(source->mem_info().total_bytes == 4 * g);
    CHECK(source->mem_info().free_bytes == 4 * g);
    if (source->caps().virtual_memory) {
      std::vector<PhysHandle> pieces;
      for (int i = 0; i < 4; ++i) {
        auto h = source->create(g);
        REQUIRE(h.ok());
        pieces.push_back(h.value);
      }
      CHECK(source->mem_info().free_bytes == 0);
      auto over = source->create(g);
      CHECK(over.status == SourceStatus::out_of_memory);
      CHECK_FALSE(source->last_error().empty());
      REQUIRE(source->destroy(pieces.back()) == SourceStatus::ok);
      pieces.pop_back();
      CHECK(source->mem_info().free_bytes == g);
      auto again = source->create(g);
      REQUIRE(again.ok());  // recovers once memory is returned
      pieces.push_back(again.value);
      for (PhysHandle h : pieces) CHECK(source->destroy(h) == SourceStatus::ok);
    } else {
      std::vector<VaRange> ranges;
      for (int i = 0; i < 4; ++i) {
        auto r = source->reserve(g, 0);
        REQUIRE(r.ok());
        ranges.push_back(r.value);
      }
      CHECK(source->reserve(g, 0).status == SourceStatus::out_of_memory);
      CHECK_FALSE(source->last_error().empty());
      REQUIRE(source->release(ranges.back()) == SourceStatus::ok);
      ranges.pop_back();
      auto again = source->reserve(g, 0);
      REQUIRE(again.ok());
      ranges.push_back(again.value);
      for (VaRange r : ranges) CHECK(source->release(r) == SourceStatus::ok);
    }
    CHECK(source->mem_info().free_bytes == 4 * g);
    return;
  }
  // A real device: ask for more than it has.
  auto owned = kind.make();
  auto source = std::make_unique<TracedSource>(*owned);
  const std::size_t g = source->caps().granularity_bytes;
  const std::size_t too_much = round_up(source->mem_info().total_bytes + g, g);
  if (source->caps().virtual_memory) {
    auto h = source->create(too_much);
    CHECK(h.status == SourceStatus::out_of_memory);
    INFO(source->last_error());
    CHECK(source->last_error().find("OUT_OF_MEMORY") != std::string::npos);
    auto small = source->create(g);  // and the source still works afterwards
    REQUIRE(small.ok());
    CHECK(source->destroy(small.value) == SourceStatus::ok);
  } else {
    auto r = source->reserve(too_much, 0);
    CHECK(r.status == SourceStatus::out_of_memory);
    INFO(source->last_error());
    CHECK_FALSE(source->last_error().empty());
    auto small = source->reserve(g, 0);
    REQUIRE(small.ok());
    CHECK(source->release(small.value) == SourceStatus::ok);
  }
}

using Injector = std::function<void(FaultOp, std::uint64_t)>;

void check_fault_injection(const Injector& fail_nth, MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  // reserve: the 2nd call from now fails, the ones around it do not.
  fail_nth(FaultOp::reserve, 2);
  auto r1 = source.reserve(4 * g, 0);
  auto r2 = source.reserve(g, 0);
  auto r3 = source.reserve(g, 0);
  REQUIRE(r1.ok());
  CHECK(r2.status == SourceStatus::fault_injected);
  REQUIRE(r3.ok());

  // release: a failed release leaves the range reserved.
  fail_nth(FaultOp::release, 1);
  CHECK(source.release(r3.value) == SourceStatus::fault_injected);
  CHECK(source.release(r3.value) == SourceStatus::ok);

  if (source.caps().virtual_memory) {
    fail_nth(FaultOp::create, 1);
    CHECK(source.create(g).status == SourceStatus::fault_injected);
    auto h = source.create(g);
    REQUIRE(h.ok());

    // A call that is invalid anyway answers invalid_argument and does not use up the fault.
    fail_nth(FaultOp::map, 1);
    CHECK(source.map(r1.value.base, g, ~PhysHandle{0}) == SourceStatus::invalid_argument);
    CHECK(source.map(r1.value.base, g, h.value) == SourceStatus::fault_injected);
    REQUIRE(source.map(r1.value.base, g, h.value) == SourceStatus::ok);  // a failed map mapped nothing

    fail_nth(FaultOp::unmap, 1);
    CHECK(source.unmap(r1.value.base, g) == SourceStatus::fault_injected);
    CHECK(source.destroy(h.value) == SourceStatus::invalid_argument);  // still mapped
    REQUIRE(source.unmap(r1.value.base, g) == SourceStatus::ok);

    fail_nth(FaultOp::destroy, 1);
    CHECK(source.destroy(h.value) == SourceStatus::fault_injected);
    CHECK(source.destroy(h.value) == SourceStatus::ok);

    // 0 cancels.
    fail_nth(FaultOp::create, 1);
    fail_nth(FaultOp::create, 0);
    auto h2 = source.create(g);
    REQUIRE(h2.ok());
    CHECK(source.destroy(h2.value) == SourceStatus::ok);
  }
  CHECK(source.release(r1.value) == SourceStatus::ok);
}

void check_data_survives_remap(const SourceUnderTest& kind, MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  if (!source.caps().virtual_memory) {
    auto r = source.reserve(2 * g, 0);
    REQUIRE(r.ok());
    kind.write_pattern(r.value.base, r.value.size_bytes, 11);
    CHECK(kind.pattern_matches(r.value.base, r.value.size_bytes, 11));
    CHECK(source.release(r.value) == SourceStatus::ok);
    return;
  }
  auto r = source.reserve(6 * g, 0);
  auto other = source.reserve(2 * g, 0);  // a second reservation: remapping crosses ranges too
  REQUIRE(r.ok());
  REQUIRE(other.ok());
  auto a = source.create(2 * g);
  auto b = source.create(2 * g);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const std::uintptr_t base = r.value.base;

  REQUIRE(source.map(base, 2 * g, a.value) == SourceStatus::ok);
  REQUIRE(source.map(base + 2 * g, 2 * g, b.value) == SourceStatus::ok);
  kind.write_pattern(base, 2 * g, 1);
  kind.write_pattern(base + 2 * g, 2 * g, 2);
  REQUIRE(source.unmap(base, 2 * g) == SourceStatus::ok);
  REQUIRE(source.unmap(base + 2 * g, 2 * g) == SourceStatus::ok);

  // Swapped and shifted: each piece brings its own bytes.
  REQUIRE(source.map(base + 4 * g, 2 * g, a.value) == SourceStatus::ok);
  REQUIRE(source.map(base, 2 * g, b.value) == SourceStatus::ok);
  CHECK(kind.pattern_matches(base + 4 * g, 2 * g, 1));
  CHECK(kind.pattern_matches(base, 2 * g, 2));

  // Rewrite through the new mapping, move to the other reservation, read again.
  kind.write_pattern(base + 4 * g, 2 * g, 3);
  REQUIRE(source.unmap(base + 4 * g, 2 * g) == SourceStatus::ok);
  REQUIRE(source.map(other.value.base, 2 * g, a.value) == SourceStatus::ok);
  CHECK(kind.pattern_matches(other.value.base, 2 * g, 3));
  CHECK(kind.pattern_matches(base, 2 * g, 2));  // b untouched by a's traffic

  CHECK(source.unmap(other.value.base, 2 * g) == SourceStatus::ok);
  CHECK(source.unmap(base, 2 * g) == SourceStatus::ok);
  CHECK(source.destroy(a.value) == SourceStatus::ok);
  CHECK(source.destroy(b.value) == SourceStatus::ok);
  CHECK(source.release(r.value) == SourceStatus::ok);
  CHECK(source.release(other.value) == SourceStatus::ok);
}

void check_threads(const SourceUnderTest& kind, MemorySource& source) {
  const std::size_t g = source.caps().granularity_bytes;
  const bool vm = source.caps().virtual_memory;
  constexpr int kThreads = 4;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto note = [&](bool ok) {
        if (!ok) failures.fetch_add(1);
      };
      if (!vm) {
        for (int i = 0; i < kind.thread_iterations; ++i) {
          auto r = source.reserve(g, 0);
          note(r.ok());
          if (r.ok()) note(source.release(r.value) == SourceStatus::ok);
        }
        return;
      }
      // Each thread works in its own reservation; all share the source's bookkeeping.
      auto reserved = source.reserve(4 * g, 0);
      note(reserved.ok());
      if (!reserved.ok()) return;
      const VaRange range = reserved.value;
      for (int i = 0; i < kind.thread_iterations; ++i) {
        auto h = source.create(g);
        note(h.ok());
        if (!h.ok()) continue;
        const std::uintptr_t va = range.base + static_cast<std::size_t>(i % 4) * g;
        note(source.map(va, g, h.value) == SourceStatus::ok);
        if (kind.write_pattern && source.caps().host_accessible) {
          const std::uint64_t seed = static_cast<std::uint64_t>(t) * 1000003 + static_cast<std::uint64_t>(i);
          kind.write_pattern(va, 4096, seed);
          note(kind.pattern_matches(va, 4096, seed));
        }
        note(source.unmap(va, g) == SourceStatus::ok);
        note(source.destroy(h.value) == SourceStatus::ok);
      }
      note(source.release(range) == SourceStatus::ok);
    });
  }
  for (auto& th : threads) th.join();
  INFO("last error: " << source.last_error());
  CHECK(failures.load() == 0);
  const ProviderMemInfo info = source.mem_info();
  CHECK(info.free_bytes <= info.total_bytes);
}

void run_conformance(const SourceUnderTest& kind) {
  INFO("source: " << kind.name);
  auto raw = kind.make();
  REQUIRE(raw != nullptr);
  TracedSource source(*raw);

  SECTION("caps and mem_info") { check_caps_and_mem_info(source); }
  SECTION("granularity: granularity-aligned reserve and release") { check_reserve_release(source); }
  SECTION("granularity: sizes that are not multiples are invalid") { check_misaligned_sizes(source); }
  if (source.caps().virtual_memory) {
    SECTION("create, map, unmap, destroy in order") { check_piece_lifecycle(source); }
    SECTION("misuse answers invalid_argument") { check_misuse(source); }
  } else {
    SECTION("no virtual memory: reserve backs, create and map are unsupported") { check_no_virtual_memory(source); }
  }
  SECTION("out_of_memory at capacity, recovery after") { check_capacity(kind); }
  if (kind.fail_nth) {
    SECTION("fault injection fails exactly the nth call") {
      check_fault_injection([&](FaultOp op, std::uint64_t nth) { kind.fail_nth(*raw, op, nth); }, source);
    }
  }
  if (kind.write_pattern) {
    SECTION("data survives unmap and map elsewhere") { check_data_survives_remap(kind, source); }
  }
  // Untraced: Catch2's message macros are not thread-safe.
  SECTION("concurrent callers") { check_threads(kind, *raw); }
}

SourceUnderTest sim_kind(bool virtual_memory) {
  SourceUnderTest k;
  k.name = virtual_memory ? "sim (virtual memory)" : "sim (no virtual memory)";
  k.make = [virtual_memory] {
    SimSourceOptions o;
    o.virtual_memory = virtual_memory;
    return std::make_unique<SimSource>(o);
  };
  k.make_with_capacity = [virtual_memory](std::size_t capacity_bytes) {
    SimSourceOptions o;
    o.virtual_memory = virtual_memory;
    o.capacity_bytes = capacity_bytes;
    return std::make_unique<SimSource>(o);
  };
  k.fail_nth = fault_injector<SimSource>();
  return k;
}

SourceUnderTest host_vmm_kind(std::size_t granularity_bytes) {
  SourceUnderTest k;
  k.name = "host_vmm";
  k.make = [granularity_bytes] {
    HostVmmSourceOptions o;
    o.granularity_bytes = granularity_bytes;
    return std::make_unique<HostVmmSource>(o);
  };
  k.make_with_capacity = [granularity_bytes](std::size_t capacity_bytes) {
    HostVmmSourceOptions o;
    o.granularity_bytes = granularity_bytes;
    o.capacity_bytes = capacity_bytes;
    return std::make_unique<HostVmmSource>(o);
  };
  k.fail_nth = fault_injector<HostVmmSource>();
  k.write_pattern = host_write_pattern;
  k.pattern_matches = host_pattern_matches;
  return k;
}

}  // namespace

TEST_CASE("SimSource with virtual memory conforms to MemorySource", "[source][sim]") {
  run_conformance(sim_kind(true));
}

TEST_CASE("SimSource without virtual memory conforms to MemorySource", "[source][sim]") {
  run_conformance(sim_kind(false));
}

TEST_CASE("SimSource keeps the peak of its physical bytes", "[source][sim]") {
  for (bool vm : {true, false}) {
    SimSourceOptions o;
    o.virtual_memory = vm;
    SimSource source(o);
    const std::size_t g = o.granularity_bytes;
    CHECK(source.peak_physical_bytes() == 0);
    if (vm) {
      auto a = source.create(3 * g);
      auto b = source.create(2 * g);
      REQUIRE(a.status == SourceStatus::ok);
      REQUIRE(b.status == SourceStatus::ok);
      REQUIRE(source.destroy(a.value) == SourceStatus::ok);
      auto c = source.create(g);
      REQUIRE(c.status == SourceStatus::ok);
      CHECK(source.physical_bytes() == 3 * g);
      CHECK(source.peak_physical_bytes() == 5 * g);  // the 3 + 2 granules of before the destroy
    } else {
      auto a = source.reserve(4 * g, g);
      REQUIRE(a.status == SourceStatus::ok);
      REQUIRE(source.release(a.value) == SourceStatus::ok);
      auto b = source.reserve(g, g);
      REQUIRE(b.status == SourceStatus::ok);
      CHECK(source.physical_bytes() == g);
      CHECK(source.peak_physical_bytes() == 4 * g);
    }
  }
}

TEST_CASE("HostVmmSource conforms to MemorySource", "[source][host_vmm]") {
  run_conformance(host_vmm_kind(2 * kMiB));
}

TEST_CASE("HostVmmSource conforms with a one-page granularity", "[source][host_vmm]") {
  run_conformance(host_vmm_kind(static_cast<std::size_t>(::sysconf(_SC_PAGESIZE))));
}

// ---- HostVmmSource only ----

namespace {

std::size_t open_fd_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) ++n;
  return n;
}

bool address_is_mapped(std::uintptr_t va) {
  unsigned char vec = 0;
  const long page = ::sysconf(_SC_PAGESIZE);
  const std::uintptr_t aligned = va / static_cast<std::uintptr_t>(page) * static_cast<std::uintptr_t>(page);
  return ::mincore(reinterpret_cast<void*>(aligned), static_cast<std::size_t>(page), &vec) == 0 || errno != ENOMEM;
}

// True if a child process that reads va does not get to exit normally (SIGSEGV, or the sanitizer's
// report and non-zero exit).
bool read_faults(std::uintptr_t va) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Die by the signal itself, not through Catch2's or a sanitizer's reporting handler.
    ::signal(SIGSEGV, SIG_DFL);
    ::signal(SIGBUS, SIG_DFL);
    volatile const unsigned char* p = reinterpret_cast<volatile const unsigned char*>(va);
    (void)*p;
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace

TEST_CASE("HostVmmSource rejects a granularity that is not a page multiple", "[source][host_vmm]") {
  HostVmmSourceOptions o;
  o.granularity_bytes = 3000;
  HostVmmSource source(o);
  CHECK(source.init_status() == SourceStatus::invalid_argument);
  const std::string why = source.last_error();
  CHECK(why.find("granularity_bytes = 3000") != std::string::npos);
  CHECK(why.find("page size") != std::string::npos);
  CHECK(source.reserve(3000, 0).status == SourceStatus::invalid_argument);
  CHECK(source.create(3000).status == SourceStatus::invalid_argument);
  CHECK(source.last_error() == why);
}

TEST_CASE("HostVmmSource: unmap keeps the reservation, release drops it, unmapped memory faults",
          "[source][host_vmm]") {
  HostVmmSource source;
  const std::size_t g = source.caps().granularity_bytes;
  auto r = source.reserve(2 * g, 0);
  REQUIRE(r.ok());
  auto h = source.create(g);
  REQUIRE(h.ok());
  REQUIRE(source.map(r.value.base, g, h.value) == SourceStatus::ok);
  *reinterpret_cast<volatile int*>(r.value.base) = 42;
  CHECK_FALSE(read_faults(r.value.base));
  CHECK(read_faults(r.value.base + g));  // reserved, never mapped: PROT_NONE
  REQUIRE(source.unmap(r.value.base, g) == SourceStatus::ok);
  CHECK(address_is_mapped(r.value.base));  // still reserved
  CHECK(read_faults(r.value.base));        // but no longer accessible
  CHECK(source.destroy(h.value) == SourceStatus::ok);
  CHECK(source.release(r.value) == SourceStatus::ok);
  CHECK_FALSE(address_is_mapped(r.value.base));
  CHECK_FALSE(address_is_mapped(r.value.base + g));
  source.check_invariants();
}

TEST_CASE("HostVmmSource: one memfd per live piece, closed on destroy and on destruction",
          "[source][host_vmm]") {
  const std::size_t fds_before = open_fd_count();
  {
    HostVmmSource source;
    const std::size_t g = source.caps().granularity_bytes;
    std::vector<PhysHandle> pieces;
    for (int i = 0; i < 8; ++i) {
      auto h = source.create(g);
      REQUIRE(h.ok());
      pieces.push_back(h.value);
    }
    CHECK(open_fd_count() == fds_before + 8);
    CHECK(source.physical_bytes() == 8 * g);
    for (int i = 0; i < 4; ++i) CHECK(source.destroy(pieces[static_cast<std::size_t>(i)]) == SourceStatus::ok);
    CHECK(open_fd_count() == fds_before + 4);
    // Leave 4 pieces (one mapped) and a range for the destructor.
    auto r = source.reserve(g, 0);
    REQUIRE(r.ok());
    REQUIRE(source.map(r.value.base, g, pieces[4]) == SourceStatus::ok);
    CHECK(source.mapped_bytes() == g);
    const HostVmmSourceCounters c = source.counters();
    CHECK(c.creates == 8);
    CHECK(c.destroys == 4);
    CHECK(c.maps == 1);
    CHECK(c.reserves == 1);
    source.check_invariants();
  }
  CHECK(open_fd_count() == fds_before);
}

TEST_CASE("HostVmmSource: mem_info reports capacity accounting", "[source][host_vmm]") {
  HostVmmSourceOptions o;
  o.capacity_bytes = 64 * kMiB;
  HostVmmSource source(o);
  auto h = source.create(6 * kMiB);
  REQUIRE(h.ok());
  CHECK(source.mem_info().total_bytes == 64 * kMiB);
  CHECK(source.mem_info().free_bytes == 58 * kMiB);
  source.set_capacity(4 * kMiB);  // below what exists: nothing more fits, free is 0
  CHECK(source.mem_info().free_bytes == 0);
  auto more = source.create(2 * kMiB);
  CHECK(more.status == SourceStatus::out_of_memory);
  CHECK(source.last_error().find("capacity") != std::string::npos);
  CHECK(source.destroy(h.value) == SourceStatus::ok);

  HostVmmSource whole_machine;  // capacity 0 = the machine's physical memory
  CHECK(whole_machine.mem_info().total_bytes ==
        static_cast<std::size_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)));
}

// ---- CUDA sources ----

#if defined(GPUMEM_HAVE_CUDA)

namespace {

void device_write_pattern(std::uintptr_t va, std::size_t size_bytes, std::uint64_t seed) {
  // The pattern everywhere but the last 4 KiB, which cudaMemset fills with a byte from the seed.
  const std::size_t tail = 4096;
  const auto words = make_pattern(size_bytes - tail, seed);
  REQUIRE(cudaMemcpy(reinterpret_cast<void*>(va), words.data(), size_bytes - tail, cudaMemcpyHostToDevice) ==
          cudaSuccess);
  REQUIRE(cudaMemset(reinterpret_cast<void*>(va + size_bytes - tail), static_cast<int>(seed & 0xff), tail) ==
          cudaSuccess);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
}

bool device_pattern_matches(std::uintptr_t va, std::size_t size_bytes, std::uint64_t seed) {
  const std::size_t tail = 4096;
  std::vector<std::uint64_t> words((size_bytes - tail) / sizeof(std::uint64_t));
  std::vector<unsigned char> tail_bytes(tail);
  if (cudaMemcpy(words.data(), reinterpret_cast<const void*>(va), size_bytes - tail, cudaMemcpyDeviceToHost) !=
      cudaSuccess)
    return false;
  if (cudaMemcpy(tail_bytes.data(), reinterpret_cast<const void*>(va + size_bytes - tail), tail,
                 cudaMemcpyDeviceToHost) != cudaSuccess)
    return false;
  if (words != make_pattern(size_bytes - tail, seed)) return false;
  for (unsigned char b : tail_bytes)
    if (b != static_cast<unsigned char>(seed & 0xff)) return false;
  return true;
}

SourceUnderTest cuda_kind(bool vmm) {
  SourceUnderTest k;
  k.name = vmm ? "cuda_vmm" : "cuda_malloc";
  k.make = [vmm] { return make_cuda_source(vmm, 0); };
  k.write_pattern = device_write_pattern;
  k.pattern_matches = device_pattern_matches;
  k.thread_iterations = 50;
  return k;
}

}  // namespace

TEST_CASE("CUDA sources without a device report unsupported instead of crashing", "[source][cuda]") {
  const int count = cuda_device_count();
  if (count == 0) {
    CudaVmmSource vmm(0);
    CHECK(vmm.init_status() == SourceStatus::unsupported);
    CHECK(vmm.reserve(2 * kMiB, 0).status == SourceStatus::unsupported);
    CHECK(vmm.create(2 * kMiB).status == SourceStatus::unsupported);
    CHECK(vmm.last_error().find("CudaVmmSource(device 0)") != std::string::npos);
    CHECK(vmm.mem_info().total_bytes == 0);
    CHECK(vmm.caps().granularity_bytes > 0);
    CudaMallocSource malloc_source(0);
    CHECK(malloc_source.init_status() == SourceStatus::unsupported);
    CHECK(malloc_source.reserve(2 * kMiB, 0).status == SourceStatus::unsupported);
    CHECK(malloc_source.last_error().find("CudaMallocSource(device 0)") != std::string::npos);
  } else {
    // A device index past the last device is the user's mistake: invalid_argument, with the range.
    CudaVmmSource vmm(count);
    CHECK(vmm.init_status() == SourceStatus::invalid_argument);
    CHECK(vmm.last_error().find("out of range") != std::string::npos);
    CudaMallocSource malloc_source(count);
    CHECK(malloc_source.init_status() == SourceStatus::invalid_argument);
  }
}

TEST_CASE("CudaVmmSource conforms to MemorySource", "[source][gpu][cuda_vmm]") {
  if (cuda_device_count() == 0) GPUMEM_SKIP("no CUDA device");
  CudaVmmSource probe(0);
  INFO(probe.last_error());
  REQUIRE(probe.init_status() == SourceStatus::ok);
  CHECK(probe.caps().granularity_bytes % (2 * kMiB) == 0);
  run_conformance(cuda_kind(true));
}

TEST_CASE("CudaMallocSource conforms to MemorySource", "[source][gpu][cuda_malloc]") {
  if (cuda_device_count() == 0) GPUMEM_SKIP("no CUDA device");
  run_conformance(cuda_kind(false));
}

TEST_CASE("CudaVmmSource restores the caller's device and times its driver calls", "[source][gpu][cuda_vmm]") {
  if (cuda_device_count() == 0) GPUMEM_SKIP("no CUDA device");
  const int last = cuda_device_count() - 1;
  REQUIRE(cudaSetDevice(last) == cudaSuccess);
  {
    CudaVmmSource source(0);
    const std::size_t g = source.caps().granularity_bytes;
    auto r = source.reserve(g, 0);
    REQUIRE(r.ok());
    auto h = source.create(g);
    REQUIRE(h.ok());
    REQUIRE(source.map(r.value.base, g, h.value) == SourceStatus::ok);
    int current = -1;
    REQUIRE(cudaGetDevice(&current) == cudaSuccess);
    CHECK(current == last);
    CHECK(source.unmap(r.value.base, g) == SourceStatus::ok);
    CHECK(source.destroy(h.value) == SourceStatus::ok);
    CHECK(source.release(r.value) == SourceStatus::ok);
    const CudaVmmCallTimes t = source.call_times();
    CHECK(t.create.calls == 1);
    CHECK(t.map.calls == 1);
    CHECK(t.set_access.calls == 1);
    CHECK(t.unmap.calls == 1);
    CHECK(t.release.calls == 1);
    CHECK(t.set_access.total_ns > 0);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
}

// The arenas of one device share its source and call it from their threads at once; the driver
// calls run outside the source's mutex (Note [Driver calls outside the source's mutex]). Four
// threads map, write, read back and unmap pieces of their own in one shared range, and try to take
// a piece another thread has mapped: the ledger refuses it, and ends empty.
TEST_CASE("CudaVmmSource serves threads at once and refuses a piece another holds", "[source][gpu][cuda_vmm]") {
  if (cuda_device_count() == 0) GPUMEM_SKIP("no CUDA device");
  CudaVmmSource source(0);
  INFO(source.last_error());
  REQUIRE(source.init_status() == SourceStatus::ok);
  const std::size_t g = source.caps().granularity_bytes;
  constexpr int kThreads = 4, kPieces = 4, kRounds = 25;
  auto range = source.reserve(std::size_t{kThreads} * kPieces * g, 0);
  REQUIRE(range.ok());
  std::atomic<PhysHandle> shared_piece{0};  // thread 0's first piece, mapped while the others try it
  std::atomic<int> failures{0}, refusals{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t)
    pool.emplace_back([&, t] {
      if (cudaSetDevice(0) != cudaSuccess) return void(++failures);
      const std::uintptr_t base = range.value.base + static_cast<std::size_t>(t) * kPieces * g;
      std::vector<PhysHandle> pieces;
      for (int i = 0; i < kPieces; ++i) {
        auto h = source.create(g);
        if (!h.ok()) return void(++failures);
        pieces.push_back(h.value);
      }
      for (int r = 0; r < kRounds; ++r) {
        for (int i = 0; i < kPieces; ++i)
          if (source.map(base + static_cast<std::size_t>(i) * g, g, pieces[static_cast<std::size_t>(i)]) !=
              SourceStatus::ok)
            ++failures;
        if (t == 0 && r == 0) shared_piece = pieces[0];
        // Another thread's mapped piece cannot be destroyed, nor its address mapped again.
        if (t != 0 && r == 0) {
          while (shared_piece.load() == 0 && failures.load() == 0) std::this_thread::yield();
          if (source.destroy(shared_piece.load()) == SourceStatus::invalid_argument) ++refusals;
          if (source.map(range.value.base, g, pieces[0]) == SourceStatus::invalid_argument) ++refusals;
        }
        const auto byte = static_cast<unsigned char>(t * 16 + r % 16);
        if (cudaMemset(reinterpret_cast<void*>(base), byte, kPieces * g) != cudaSuccess) ++failures;
        unsigned char back = 0;
        if (cudaMemcpy(&back, reinterpret_cast<void*>(base + kPieces * g - 1), 1, cudaMemcpyDeviceToHost) !=
                cudaSuccess ||
            back != byte)
          ++failures;
        if (t == 0 && r == 0)
          while (refusals.load() < 2 * (kThreads - 1) && failures.load() == 0) std::this_thread::yield();
        for (int i = 0; i < kPieces; ++i)
          if (source.unmap(base + static_cast<std::size_t>(i) * g, g) != SourceStatus::ok) ++failures;
      }
      for (PhysHandle h : pieces)
        if (source.destroy(h) != SourceStatus::ok) ++failures;
    });
  for (auto& th : pool) th.join();
  CHECK(failures.load() == 0);
  CHECK(refusals.load() == 2 * (kThreads - 1));
  CHECK(source.mapped_bytes() == 0);
  CHECK(source.physical_bytes() == 0);
  const CudaVmmCallTimes t = source.call_times();
  CHECK(t.map.calls == std::uint64_t{kThreads} * kPieces * kRounds);
  CHECK(t.set_access.calls == t.map.calls);
  CHECK(t.unmap.calls == t.map.calls);
  CHECK(t.create.calls == std::uint64_t{kThreads} * kPieces);
  CHECK(t.release.calls == t.create.calls);
  CHECK(source.release(range.value) == SourceStatus::ok);
}

TEST_CASE("CudaStreamEvents records, completes and reuses pooled events", "[gpu][stream_events]") {
  if (cuda_device_count() == 0) GPUMEM_SKIP("no CUDA device");
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  CudaStreamEvents events(0);
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess);
  const auto sid = static_cast<StreamId>(reinterpret_cast<std::uintptr_t>(stream));
  void* buffer = nullptr;
  REQUIRE(cudaMalloc(&buffer, 64 * kMiB) == cudaSuccess);

  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 20; ++i) REQUIRE(cudaMemsetAsync(buffer, i, 64 * kMiB, stream) == cudaSuccess);
    const EventToken a = events.record(sid);
    const EventToken b = events.record(0);  // the legacy default stream
    CHECK(a != 0);
    CHECK(b != 0);
    CHECK(a != b);
    events.synchronize(a);
    CHECK(events.query(a));
    events.synchronize_stream(0);
    CHECK(events.query(b));
    events.release(a);
    events.release(b);
  }
  CHECK(events.events_created() == 2);  // reused from the pool after the first round
  CHECK(events.events_pooled() == 2);

  // A marker behind queued work: once the stream is synchronized, it is complete.
  for (int i = 0; i < 50; ++i) REQUIRE(cudaMemsetAsync(buffer, i, 64 * kMiB, stream) == cudaSuccess);
  const EventToken c = events.record(sid);
  events.synchronize_stream(sid);
  CHECK(events.query(c));
  events.release(c);

  // Every call that can wait or cost was timed: 7 records, 7 queries, 3 event and 4 stream waits.
  const CudaEventCallTimes t = events.call_times();
  CHECK(t.record.calls == 7);
  CHECK(t.query.calls == 7);
  CHECK(t.synchronize.calls == 3);
  CHECK(t.synchronize_stream.calls == 4);
  for (const CudaCallTime* c : {&t.record, &t.query, &t.synchronize, &t.synchronize_stream}) {
    CHECK(c->total_ns > 0);
    CHECK(c->max_ns > 0);
    CHECK(c->max_ns <= c->total_ns);
  }

  CHECK(cudaFree(buffer) == cudaSuccess);
  CHECK(cudaStreamDestroy(stream) == cudaSuccess);
}

#endif  // GPUMEM_HAVE_CUDA
