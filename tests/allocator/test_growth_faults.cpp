// Driver faults in the middle of a growth (issue 15): the source's create or map fails on its nth
// call while the engine grows for one request (PyTorch's expandable segments terminate the process
// there: pytorch issue 188008). The request must end in an OOM value naming the fault (or succeed
// when the fault lands after the growth), every physical piece and mapping the engine does not
// account for must be gone (nothing leaked), and the engine must serve the next request and give
// everything back. SimSource stands in for the driver (create = cuMemCreate, map = cuMemMap +
// cuMemSetAccess, which CudaVmmSource undoes together); scripts/gpu/reliability.sh runs the CUDA
// source's own [gpu] cases on the H200.
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/sim_source.h"
#include "growth_fault_checks.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::testing;

namespace {

constexpr std::size_t MiB = kFaultMiB;

Config config(bool expandable) { return growth_fault_config(expandable); }

}  // namespace

TEST_CASE("a create or map that fails mid-growth leaves no leak and a usable engine", "[engine][faults]") {
  for (const bool expandable : {true, false}) {
    for (const SimSource::Op op : {SimSource::Op::create, SimSource::Op::map, SimSource::Op::reserve}) {
      for (std::uint64_t nth = 1; nth <= 12; ++nth) {
        INFO("expandable " << expandable << ", op " << int(op) << ", fails on call " << nth);
        SimSource source;
        auto events = make_immediate_events();
        CachingAllocator engine(source, *events, config(expandable));
        // Something live before the fault: a growth in the middle of a working engine.
        auto before = engine.allocate(3 * MiB, 0);
        REQUIRE(before.ok());
        source.fail_nth(op, nth);
        // 20 MiB: ten 2 MiB pieces (expandable) or one segment: the fault lands inside the growth.
        auto r = engine.allocate(20 * MiB, 0);
        source.fail_nth(op, 0);
        if (!r.ok()) {
          REQUIRE(r.oom.has_value());
          CHECK(r.oom->cause == SourceStatus::fault_injected);
        }
        check_no_leak(engine, source, expandable);
        // Still usable: the same request now succeeds, and everything goes back.
        auto again = engine.allocate(20 * MiB, 0);
        REQUIRE(again.ok());
        check_everything_returns(engine, source, before, r, again);
        const SimSourceCounters c = source.counters();
        CHECK(c.creates == c.destroys);
        CHECK(c.maps == c.unmaps);
      }
    }
  }
}

TEST_CASE("faults at every growth call of a busy engine never leak", "[engine][faults]") {
  SimSource source;
  auto events = make_immediate_events();
  CachingAllocator engine(source, *events, config(true));
  std::vector<void*> live;
  std::size_t ooms = 0;
  for (int i = 0; i < 400; ++i) {
    // Every 7th create and every 11th map fails, over and over.
    if (i % 7 == 0) source.fail_nth(SimSource::Op::create, 1 + i % 3);
    if (i % 11 == 0) source.fail_nth(SimSource::Op::map, 1 + i % 4);
    // Unmaps fail too: of kept mappings in a growth's way, and of pieces empty_cache gives back.
    if (i % 13 == 0) source.fail_nth(SimSource::Op::unmap, 1 + i % 2);
    auto r = engine.allocate((1 + i % 9) * MiB + 4096 * (i % 5), i % 3);
    if (r.ok()) {
      live.push_back(r.ptr);
    } else {
      ++ooms;
      CHECK(r.oom->cause == SourceStatus::fault_injected);
    }
    if (live.size() > 20) {
      CHECK(engine.free(live.front()) == FreeStatus::ok);
      live.erase(live.begin());
    }
    if (i % 50 == 0) engine.empty_cache();
    CHECK(source.physical_bytes() == engine.totals().reserved_bytes);
    CHECK(source.mapped_bytes() == source.physical_bytes() + engine.totals().kept_mapping_bytes);
  }
  engine.check_invariants();
  CHECK(ooms > 0);  // the faults were reached
  source.fail_nth(SimSource::Op::create, 0);
  source.fail_nth(SimSource::Op::map, 0);
  source.fail_nth(SimSource::Op::unmap, 0);
  for (void* p : live) CHECK(engine.free(p) == FreeStatus::ok);
  engine.empty_cache();
  CHECK(source.physical_bytes() == 0);
  CHECK(source.mapped_bytes() == 0);
}
