// Links gpumem::alloc from an installed gpumem package: parses an engine configuration, runs the
// engine on a SimSource with an observer (the public event stream, std::span: C++20) and checks the
// events and totals agree. Exit status 0 if they do.
#include <cstdio>
#include <memory>
#include <span>
#include <variant>

#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/config.h"
#include "gpumem/alloc/events.h"
#include "gpumem/alloc/sim_source.h"
#include "gpumem/alloc/stream_events.h"

namespace {

struct Counter final : gpumem::alloc::AllocObserver {
  int allocs = 0;
  int frees = 0;
  void on_events(std::span<const gpumem::alloc::AllocEvent> events) override {
    for (const auto& e : events) {
      if (e.kind == gpumem::alloc::EventKind::alloc) ++allocs;
      if (e.kind == gpumem::alloc::EventKind::free_requested) ++frees;
    }
  }
};

}  // namespace

int main() {
  auto parsed = gpumem::alloc::parse_config("expandable_segments:True,check_invariants:True");
  if (!std::holds_alternative<gpumem::alloc::Config>(parsed)) return 1;
  gpumem::alloc::SimSource source;
  auto events = gpumem::alloc::make_immediate_events();
  gpumem::alloc::CachingAllocator engine(source, *events, std::get<gpumem::alloc::Config>(parsed));
  auto counter = std::make_shared<Counter>();
  engine.attach_observer(counter);
  gpumem::alloc::AllocResult r = engine.allocate(1 << 20, 0);
  if (!r.ok()) return 1;
  const auto during = engine.totals().allocated_bytes;
  if (engine.free(r.ptr) != gpumem::alloc::FreeStatus::ok) return 1;
  std::printf("consumer: allocated %zu bytes, %d alloc and %d free events\n", static_cast<std::size_t>(during),
              counter->allocs, counter->frees);
  return during >= (1 << 20) && counter->allocs == 1 && counter->frees == 1 && engine.totals().allocated_bytes == 0 ? 0 : 1;
}
