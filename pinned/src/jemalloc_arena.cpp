#include "jemalloc_arena.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <system_error>

#include "jemalloc_api.h"

// The options of gpumem's private jemalloc (jemalloc reads this symbol once, at its first use).
// The process's own allocator is untouched: this copy serves only gpumem's pinned arenas.
//   retain:false           jemalloc asks the alloc hook for exactly the extent it needs when its
//                          caches cannot serve a request, instead of growing by geometric steps
//                          whose unused tails it keeps (retained) where no hook ever gives them
//                          back. The pinned allocator carves extents from its regions itself.
//   dirty_decay_ms:0       a free extent goes back through the dalloc hook at once: the region
//                          table, not jemalloc's first-fit cache, decides where large extents go
//   muzzy_decay_ms:-1      never madvise (the arena sets both again, see create())
//   narenas:1, tcache:false  nothing uses automatic arenas or thread caches here
// MALLOC_CONF in the environment is read after this and wins, as for any jemalloc; the pinned
// allocator still works with retain:true, only less tightly (see settings()).
extern "C" const char* gpumem_je_malloc_conf;
const char* gpumem_je_malloc_conf = "retain:false,dirty_decay_ms:0,muzzy_decay_ms:-1,narenas:1,tcache:false";

namespace gpumem::pinned::detail {

struct JemallocArena::Hooks {
  extent_hooks_t table;  // first member: jemalloc hands this pointer back to every hook
  ExtentProvider* provider;
  std::atomic<std::uint64_t> allocs{0}, alloc_failures{0}, fixed_address_refusals{0};
  std::atomic<std::uint64_t> dallocs{0}, destroys{0}, commits{0};
  std::atomic<std::uint64_t> decommit_refusals{0}, purge_lazy_refusals{0}, purge_forced_refusals{0};
  std::atomic<std::uint64_t> splits{0}, merges{0}, merge_refusals{0};
};

namespace {

using Hooks = JemallocArena::Hooks;

Hooks& hooks_of(extent_hooks_t* table) {
  static_assert(offsetof(Hooks, table) == 0, "jemalloc's pointer must be the Hooks object's address");
  return *reinterpret_cast<Hooks*>(table);
}
void bump(std::atomic<std::uint64_t>& c) { c.fetch_add(1, std::memory_order_relaxed); }

// jemalloc's hook convention: false = success, true = failure / refusal.
void* hook_alloc(extent_hooks_t* t, void* new_addr, std::size_t size, std::size_t alignment, bool* zero,
                 bool* commit, unsigned /*arena_ind*/) {
  Hooks& h = hooks_of(t);
  if (new_addr != nullptr) {
    bump(h.fixed_address_refusals);
    return nullptr;
  }
  void* p = h.provider->obtain_extent(size, alignment, zero);
  if (p == nullptr) {
    bump(h.alloc_failures);
    return nullptr;
  }
  bump(h.allocs);
  *commit = true;
  return p;
}
bool hook_dalloc(extent_hooks_t* t, void* addr, std::size_t size, bool /*committed*/, unsigned) {
  Hooks& h = hooks_of(t);
  bump(h.dallocs);
  h.provider->give_back_extent(addr, size);
  return false;
}
void hook_destroy(extent_hooks_t* t, void* addr, std::size_t size, bool /*committed*/, unsigned) {
  Hooks& h = hooks_of(t);
  bump(h.destroys);
  h.provider->give_back_extent(addr, size);
}
bool hook_commit(extent_hooks_t* t, void*, std::size_t, std::size_t, std::size_t, unsigned) {
  bump(hooks_of(t).commits);
  return false;
}
bool hook_decommit(extent_hooks_t* t, void*, std::size_t, std::size_t, std::size_t, unsigned) {
  bump(hooks_of(t).decommit_refusals);
  return true;
}
bool hook_purge_lazy(extent_hooks_t* t, void*, std::size_t, std::size_t, std::size_t, unsigned) {
  bump(hooks_of(t).purge_lazy_refusals);
  return true;
}
bool hook_purge_forced(extent_hooks_t* t, void*, std::size_t, std::size_t, std::size_t, unsigned) {
  bump(hooks_of(t).purge_forced_refusals);
  return true;
}
bool hook_split(extent_hooks_t* t, void*, std::size_t, std::size_t, std::size_t, bool, unsigned) {
  bump(hooks_of(t).splits);
  return false;
}
bool hook_merge(extent_hooks_t* t, void* addr_a, std::size_t, void* addr_b, std::size_t, bool, unsigned) {
  Hooks& h = hooks_of(t);
  if (!h.provider->may_merge(addr_a, addr_b)) {
    bump(h.merge_refusals);
    return true;
  }
  bump(h.merges);
  return false;
}

// jemalloc 5.3's arena_config_t (include/jemalloc/internal/arena_types.h), the argument of
// experimental.arenas_create_ext; not in the public header.
struct ArenaConfig53 {
  extent_hooks_t* extent_hooks;
  bool metadata_use_hooks;
};

std::string mallctl_words(const std::string& name, int rc) {
  return fmt::format("jemalloc mallctl(\"{}\") failed: {} (errno {})", name, std::generic_category().message(rc), rc);
}

int flags_for(unsigned index, std::size_t alignment_bytes) {
  int flags = MALLOCX_ARENA(index) | MALLOCX_TCACHE_NONE;
  if (alignment_bytes > 1) flags |= MALLOCX_ALIGN(alignment_bytes);
  return flags;
}

template <class T>
T read_ctl(const std::string& name) {
  T value{};
  std::size_t len = sizeof(value);
  if (gpumem_je_mallctl(name.c_str(), &value, &len, nullptr, 0) != 0) return T{};
  return value;
}

}  // namespace

std::unique_ptr<JemallocArena> JemallocArena::create(ExtentProvider& provider, std::size_t growth_limit_bytes,
                                                     std::string* error) {
  auto hooks = std::make_unique<Hooks>();
  hooks->table = extent_hooks_t{hook_alloc,      hook_dalloc,       hook_destroy, hook_commit, hook_decommit,
                                hook_purge_lazy, hook_purge_forced, hook_split,   hook_merge};
  hooks->provider = &provider;

  unsigned index = 0;
  std::size_t len = sizeof(index);
  ArenaConfig53 config{&hooks->table, false};
  int rc = ENOENT;
#if JEMALLOC_VERSION_MAJOR == 5 && JEMALLOC_VERSION_MINOR >= 3
  rc = gpumem_je_mallctl("experimental.arenas_create_ext", &index, &len, &config, sizeof(config));
#endif
  if (rc == ENOENT) {
    extent_hooks_t* table = &hooks->table;
    len = sizeof(index);
    rc = gpumem_je_mallctl("arenas.create", &index, &len, &table, sizeof(table));
  }
  if (rc != 0) {
    *error = mallctl_words("arenas.create", rc);
    return nullptr;
  }
  std::unique_ptr<JemallocArena> arena(new JemallocArena(std::move(hooks), index));
  if (!arena->set_decay_ms(0, -1)) {
    *error = mallctl_words(fmt::format("arena.{}.dirty_decay_ms", index), EINVAL);
    return nullptr;  // the destructor destroys the arena
  }
  if (growth_limit_bytes != 0) {
    const std::string name = fmt::format("arena.{}.retain_grow_limit", index);
    rc = gpumem_je_mallctl(name.c_str(), nullptr, nullptr, &growth_limit_bytes, sizeof(growth_limit_bytes));
    if (rc != 0 && rc != ENOENT) {  // ENOENT: retain is off, nothing grows geometrically
      *error = mallctl_words(name, rc);
      return nullptr;
    }
  }
  return arena;
}

JemallocArena::JemallocArena(std::unique_ptr<Hooks> hooks, unsigned index) : hooks_(std::move(hooks)), index_(index) {}

JemallocArena::~JemallocArena() {
  const std::string name = fmt::format("arena.{}.destroy", index_);
  gpumem_je_mallctl(name.c_str(), nullptr, nullptr, nullptr, 0);
}

bool JemallocArena::set_decay_ms(long dirty_ms, long muzzy_ms) noexcept {
  ssize_t dirty = dirty_ms, muzzy = muzzy_ms;
  const std::string d = fmt::format("arena.{}.dirty_decay_ms", index_);
  const std::string m = fmt::format("arena.{}.muzzy_decay_ms", index_);
  return gpumem_je_mallctl(d.c_str(), nullptr, nullptr, &dirty, sizeof(dirty)) == 0 &&
         gpumem_je_mallctl(m.c_str(), nullptr, nullptr, &muzzy, sizeof(muzzy)) == 0;
}

void* JemallocArena::allocate(std::size_t size_bytes, std::size_t alignment_bytes) noexcept {
  return gpumem_je_mallocx(size_bytes, flags_for(index_, alignment_bytes));
}

void JemallocArena::deallocate(void* ptr, std::size_t size_bytes, std::size_t alignment_bytes) noexcept {
  gpumem_je_sdallocx(ptr, size_bytes, flags_for(index_, alignment_bytes));
}

std::size_t JemallocArena::usable_size(std::size_t size_bytes, std::size_t alignment_bytes) const noexcept {
  return gpumem_je_nallocx(size_bytes, flags_for(index_, alignment_bytes));
}

void JemallocArena::purge() noexcept {
  const std::string name = fmt::format("arena.{}.purge", index_);
  gpumem_je_mallctl(name.c_str(), nullptr, nullptr, nullptr, 0);
}

ArenaStats JemallocArena::stats() const {
  std::uint64_t epoch = 1;
  std::size_t len = sizeof(epoch);
  gpumem_je_mallctl("epoch", &epoch, &len, &epoch, sizeof(epoch));
  const std::size_t page = read_ctl<std::size_t>("arenas.page");
  const std::string p = fmt::format("stats.arenas.{}.", index_);
  ArenaStats s;
  s.small_allocated_bytes = read_ctl<std::size_t>(p + "small.allocated");
  s.large_allocated_bytes = read_ctl<std::size_t>(p + "large.allocated");
  s.active_bytes = read_ctl<std::size_t>(p + "pactive") * page;
  s.dirty_bytes = read_ctl<std::size_t>(p + "pdirty") * page;
  s.mapped_bytes = read_ctl<std::size_t>(p + "mapped");
  s.retained_bytes = read_ctl<std::size_t>(p + "retained");
  return s;
}

HookCounts JemallocArena::hook_counts() const noexcept {
  const Hooks& h = *hooks_;
  auto r = [](const std::atomic<std::uint64_t>& c) { return c.load(std::memory_order_relaxed); };
  return {r(h.allocs),       r(h.alloc_failures),    r(h.fixed_address_refusals), r(h.dallocs),
          r(h.destroys),     r(h.commits),           r(h.decommit_refusals),      r(h.purge_lazy_refusals),
          r(h.purge_forced_refusals), r(h.splits),   r(h.merges),                 r(h.merge_refusals)};
}

std::string JemallocArena::global_options() {
  const bool retain = read_ctl<bool>("opt.retain");
  const bool oblivious = read_ctl<bool>("opt.cache_oblivious");
  const char* version = read_ctl<const char*>("version");
  return fmt::format("jemalloc {} (private), retain:{}, cache_oblivious:{}", version ? version : "?", retain,
                     oblivious);
}

}  // namespace gpumem::pinned::detail
