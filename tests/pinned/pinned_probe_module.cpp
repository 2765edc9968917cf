// A shared library that links gpumem::pinned, for the symbol and dlopen checks of test_pinned: it is
// what a Python extension or the torch adapter carrying the pinned allocator looks like to the
// dynamic linker. Exports one function.
#include "gpumem/alloc/stream_events.h"
#include "gpumem/pinned/pinned_allocator.h"

extern "C" __attribute__((visibility("default"))) int gpumem_pinned_probe() {
  using namespace gpumem;
  pinned::LockedHostSource source({pinned::LockMode::none, 0});
  auto events = alloc::make_immediate_events();
  pinned::PinnedAllocator pa(source, *events);
  auto r = pa.allocate(3 << 20);
  if (!r.ok() || !pa.owns(r.ptr)) return 1;
  static_cast<char*>(r.ptr)[0] = 1;
  return pa.free(r.ptr) == alloc::FreeStatus::ok ? 0 : 2;
}
