// The model of PyTorch 2.11's DeviceCachingAllocator. The algorithm is described in
// pytorch_policy.h and docs/notes/pytorch-allocator-model.md; the comments
// here say where the model follows a particular detail of PyTorch's behaviour.
#include "gpumem/forensics/pytorch_policy.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <set>
#include <unordered_map>
#include <vector>

#include "gpumem/forensics/call_costs.h"

namespace gpumem::forensics {
namespace {

constexpr std::size_t kMinBlockSize = 512;
constexpr std::size_t kSmallSize = std::size_t{1} << 20;
constexpr std::size_t kSmallBuffer = std::size_t{2} << 20;
constexpr std::size_t kMinLargeAlloc = std::size_t{10} << 20;
constexpr std::size_t kRoundLarge = std::size_t{2} << 20;
// Model-made addresses start far below where CUDA maps device memory (~0x7f.. on Linux), so they
// never meet addresses taken from a trace.
constexpr std::uint64_t kFirstAddress = 0x100000000000ULL;

[[noreturn]] void invariant_failed(const char* what) {
  std::fprintf(stderr, "gpumem: PytorchPolicy invariant broken: %s\n", what);
  std::abort();
}

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

}  // namespace

struct PytorchPolicy::Model {
  struct Pool;
  struct ExpandableSegment;

  struct Block {
    std::uint64_t stream = 0;
    std::size_t size = 0;
    std::size_t requested = 0;
    std::uint64_t addr = 0;
    Pool* pool = nullptr;
    Block* prev = nullptr;
    Block* next = nullptr;
    ExpandableSegment* segment = nullptr;  // set for blocks of expandable segments
    bool allocated = false;
    bool mapped = true;
    std::int64_t gc_count_base = 0;
    bool is_split() const { return prev != nullptr || next != nullptr; }
  };

  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      if (a->size != b->size) return a->size < b->size;
      return a->addr < b->addr;
    }
  };
  struct ByAddress {
    bool operator()(const Block* a, const Block* b) const {
      if (a->stream != b->stream) return a->stream < b->stream;
      return a->addr < b->addr;
    }
  };

  struct Pool {
    bool is_small = false;
    std::set<Block*, BySize> blocks;        // free, mapped
    std::set<Block*, ByAddress> unmapped;   // expandable address space without pages
    std::int64_t get_free_blocks_call_count = 0;
  };

  struct ExpandableSegment {
    std::uint64_t base = 0;
    std::size_t page_bytes = 0;
    std::size_t va_bytes = 0;
    std::uint64_t stream = 0;
    Pool* pool = nullptr;
    std::vector<bool> page_mapped;
    std::size_t mapped_pages = 0;
  };

  struct Params {
    std::uint64_t stream = 0;
    std::size_t size = 0;        // rounded request
    std::size_t alloc_size = 0;  // segment size a classic allocation would create
    Pool* pool = nullptr;
    Block* block = nullptr;
  };

  explicit Model(PytorchModelOptions o) : opt(o) { small.is_small = true; }

  PytorchModelOptions opt;
  Pool small, large;
  std::deque<Block> block_storage;
  std::vector<Block*> spare_blocks;
  std::deque<ExpandableSegment> segment_storage;
  std::vector<ExpandableSegment*> expandable_segments;
  std::unordered_map<std::uint64_t, Block*> live;  // allocated blocks by address
  std::uint64_t next_address = kFirstAddress;

  std::size_t allocated_bytes = 0;
  std::size_t requested_bytes = 0;
  std::size_t reserved_bytes = 0;  // total_allocated_memory in PyTorch
  std::uint64_t classic_segments = 0;
  PolicyCounters counters;
  // cudaMalloc's answers recorded in the trace: size -> addresses in trace order.
  std::unordered_map<std::size_t, std::deque<std::uint64_t>> recorded_addresses;
  std::map<std::uint64_t, std::size_t> classic_ranges;  // live classic segments: base -> size
  bool log_segments = false;
  std::vector<ModelSegmentEvent> segment_log;

  void log(TraceAction action, std::uint64_t addr, std::size_t size) {
    if (log_segments) segment_log.push_back(ModelSegmentEvent{action, addr, size});
  }

  // ---- blocks ----
  Block* new_block() {
    if (!spare_blocks.empty()) {
      Block* b = spare_blocks.back();
      spare_blocks.pop_back();
      *b = Block{};
      return b;
    }
    return &block_storage.emplace_back();
  }
  void delete_block(Block* b) { spare_blocks.push_back(b); }

  bool gc_enabled() const {
    return opt.cap_bytes != std::numeric_limits<std::size_t>::max() && opt.garbage_collection_threshold > 0.0;
  }
  void insert_free(Pool& pool, Block* b) {
    b->gc_count_base = pool.get_free_blocks_call_count;
    pool.blocks.insert(b);
  }

  // ---- sizes ----
  std::size_t divisions_for(std::size_t size) const {
    std::size_t mib = size >> 20;
    std::size_t index = 0;
    while (mib > 1 && index < 15) {
      mib >>= 1;
      ++index;
    }
    return opt.roundup_power2_divisions[index];
  }
  std::size_t round_size(std::size_t size) const {
    if (size < kMinBlockSize) return kMinBlockSize;
    const std::size_t divisions = divisions_for(size);
    if (divisions > 1 && size > kMinBlockSize * divisions) {
      if ((size & (size - 1)) == 0) return size;  // powers of two stay
      std::size_t floor2 = std::size_t{1} << (63 - __builtin_clzll(size));
      std::size_t div_log = 63 - __builtin_clzll(divisions);
      const std::size_t step = floor2 >> div_log;
      if (step == 0) return floor2 << 1;
      const std::size_t down = size & ~(step - 1);
      return down == size ? size : down + step;
    }
    return round_up(size, kMinBlockSize);
  }
  std::size_t allocation_size(std::size_t size) const {
    if (size <= kSmallSize) return kSmallBuffer;
    if (size < kMinLargeAlloc) return opt.large_segment_size_bytes;
    return round_up(size, kRoundLarge);
  }
  Pool& pool_for(std::size_t size) { return size <= kSmallSize ? small : large; }

  // ---- best fit ----
  static std::size_t expandable_size(const Block* b) {
    return b->size + (b->next && !b->next->mapped ? b->next->size : 0);
  }

  bool get_free_block(Params& p) {
    Pool& pool = *p.pool;
    if (gc_enabled()) ++pool.get_free_blocks_call_count;
    Block key;
    key.stream = p.stream;
    key.size = p.size;
    key.addr = 0;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
    if ((*it)->segment) {
      if (opt.expandable_segments) {
        // A block bordering unmapped space can grow: best fit values it at that larger size, so
        // a smaller "expandable size" further along may be the better fit.
        auto next = std::next(it);
        while ((*it)->segment && next != pool.blocks.end() && (*next)->stream == p.stream &&
               expandable_size(*next) < expandable_size(*it)) {
          it = next++;
        }
      } else {
        do {
          ++it;
        } while (it != pool.blocks.end() && (*it)->segment && (*it)->stream == p.stream);
        if (it == pool.blocks.end() || (*it)->stream != p.stream) return false;
      }
    }
    const std::size_t max_split = opt.max_split_size_bytes;
    if (p.size < max_split && (*it)->size >= max_split) return false;
    if (p.size >= max_split && (*it)->size >= p.size + opt.max_non_split_rounding_bytes) return false;
    p.block = *it;
    pool.blocks.erase(it);
    return true;
  }

  bool should_split(const Block* b, std::size_t size) const {
    const std::size_t remaining = b->size - size;
    if (b->pool->is_small || opt.expandable_segments) return remaining >= kMinBlockSize;
    return size < opt.max_split_size_bytes && remaining > kSmallSize;
  }

  // ---- growth ----
  bool over_cap(std::size_t extra) const {
    return opt.cap_bytes != std::numeric_limits<std::size_t>::max() && reserved_bytes + extra > opt.cap_bytes;
  }

  bool alloc_block(Params& p, bool is_retry) {
    if (is_retry) ++counters.alloc_retries;
    if (over_cap(p.alloc_size)) return false;
    if (opt.expandable_segments) {
      p.block = try_allocate_expandable_block(p.stream, *p.pool, p.size);
      return p.block != nullptr;
    }
    const std::size_t size = p.alloc_size;
    if (reserved_bytes + size > opt.device_total_bytes) return false;  // cudaMalloc: out of memory
    Block* b = new_block();
    b->stream = p.stream;
    b->size = size;
    b->pool = p.pool;
    b->addr = segment_address(size);
    classic_ranges.emplace(b->addr, size);
    reserved_bytes += size;
    ++classic_segments;
    ++counters.creates;
    log(TraceAction::segment_alloc, b->addr, size);
    p.block = b;
    return true;
  }

  bool range_free(std::uint64_t addr, std::size_t size) const {
    auto it = classic_ranges.upper_bound(addr);
    if (it != classic_ranges.end() && it->first < addr + size) return false;
    if (it != classic_ranges.begin()) {
      --it;
      if (it->first + it->second > addr) return false;
    }
    return true;
  }

  // The address cudaMalloc returns for a new segment (see use_trace_segment_addresses).
  std::uint64_t segment_address(std::size_t size) {
    if (auto it = recorded_addresses.find(size); it != recorded_addresses.end()) {
      auto& queue = it->second;
      while (!queue.empty()) {
        const std::uint64_t addr = queue.front();
        queue.pop_front();
        if (range_free(addr, size)) return addr;
      }
    }
    const std::uint64_t addr = next_address;
    next_address += round_up(size, kSmallBuffer);
    return addr;
  }

  void release_block(Block* b) {  // cudaFree of an unsplit free classic block
    b->pool->blocks.erase(b);
    reserved_bytes -= b->size;
    classic_ranges.erase(b->addr);
    --classic_segments;
    ++counters.releases;
    log(TraceAction::segment_free, b->addr, b->size);
    delete_block(b);
  }

  bool release_available_cached_blocks(const Params& p) {
    const std::size_t max_split = opt.max_split_size_bytes;
    if (max_split == std::numeric_limits<std::size_t>::max()) return false;
    Pool& pool = *p.pool;
    Block key;
    key.stream = p.stream;
    key.size = std::max(p.size, max_split);
    key.addr = 0;
    auto it = pool.blocks.lower_bound(&key);
    if (it == pool.blocks.end() || (*it)->stream != p.stream) {
      // No single oversize block is large enough: free oversize blocks from the largest down.
      if (it == pool.blocks.begin()) return false;
      std::size_t released = 0;
      --it;
      while (released < key.size && (*it)->size >= max_split && (*it)->stream == p.stream) {
        auto cur = it;
        released += (*it)->size;
        if (it != pool.blocks.begin()) {
          --it;
          release_classic_if_unsplit(*cur);
        } else {
          release_classic_if_unsplit(*cur);
          break;
        }
      }
      return released >= key.size;
    }
    release_classic_if_unsplit(*it);
    return true;
  }
  void release_classic_if_unsplit(Block* b) {
    // Oversize blocks are never split, so in classic mode these are whole segments. Expandable
    // blocks are skipped by PyTorch here (PR #134338).
    if (!b->segment && !b->is_split()) release_block(b);
  }

  void garbage_collect_cached_blocks() {
    const auto threshold =
        static_cast<std::size_t>(opt.garbage_collection_threshold * static_cast<double>(opt.cap_bytes));
    if (reserved_bytes <= threshold) return;
    const std::size_t target = reserved_bytes - threshold;
    std::size_t reclaimed = 0;
    std::size_t total_age = 0;
    int freeable = 0;
    for (Block* b : large.blocks) {
      if (!b->is_split() && !b->segment) {
        total_age += static_cast<std::size_t>(large.get_free_blocks_call_count - b->gc_count_base);
        ++freeable;
      }
    }
    if (freeable == 0) return;
    bool freed = true;
    while (reclaimed < target && freed && freeable > 0) {
      const double age_threshold = static_cast<double>(total_age) / freeable;
      freed = false;
      for (auto it = large.blocks.begin(); it != large.blocks.end();) {
        Block* b = *it;
        ++it;
        const auto age = static_cast<std::size_t>(large.get_free_blocks_call_count - b->gc_count_base);
        if (!b->is_split() && !b->segment && static_cast<double>(age) >= age_threshold) {
          freed = true;
          reclaimed += b->size;
          total_age -= age;
          --freeable;
          release_block(b);
        }
      }
    }
  }

  void release_blocks(Pool& pool) {
    std::vector<Block*> to_unmap;
    for (auto it = pool.blocks.begin(); it != pool.blocks.end();) {
      Block* b = *it;
      ++it;
      if (b->segment) {
        to_unmap.push_back(b);
      } else if (!b->is_split()) {
        release_block(b);
      }
    }
    for (Block* b : to_unmap) {
      Block* unmapped = unmap_block(b);
      if (unmapped && !unmapped->is_split()) release_expandable_segment(unmapped);
    }
  }

  bool release_cached_blocks() {
    release_blocks(large);
    release_blocks(small);
    return true;
  }

  // ---- expandable segments ----
  static bool allocatable(const Block* b) { return b && !b->allocated; }

  Block* find_expandable_block(std::uint64_t stream, Pool& pool, std::size_t size) {
    auto has_room = [size](const Block* b) {
      std::size_t bytes = 0;
      while (bytes < size && allocatable(b)) {
        bytes += b->size;
        b = b->next;
      }
      return bytes >= size;
    };
    Block key;
    key.stream = stream;
    key.addr = 0;
    for (auto it = pool.unmapped.lower_bound(&key); it != pool.unmapped.end() && (*it)->stream == stream; ++it) {
      Block* c = *it;
      if (allocatable(c->prev)) c = c->prev;  // a free block right before the hole helps
      if (has_room(c)) return c;
    }
    // A new segment: address space for 1.125 x device memory, in pages of the pool's size.
    ExpandableSegment& seg = segment_storage.emplace_back();
    seg.page_bytes = pool.is_small ? kSmallBuffer : opt.large_segment_size_bytes;
    const std::size_t pages = (opt.device_total_bytes + opt.device_total_bytes / 8 + seg.page_bytes - 1) / seg.page_bytes;
    seg.va_bytes = pages * seg.page_bytes;
    seg.base = round_up(next_address, seg.page_bytes);
    next_address = seg.base + seg.va_bytes;
    seg.stream = stream;
    seg.pool = &pool;
    seg.page_mapped.assign(pages, false);
    expandable_segments.push_back(&seg);
    Block* b = new_block();
    b->stream = stream;
    b->size = seg.va_bytes;
    b->addr = seg.base;
    b->pool = &pool;
    b->segment = &seg;
    b->mapped = false;
    pool.unmapped.insert(b);
    return b;
  }

  // Maps the pages under [to_map->addr, +size) and merges the block with free neighbours.
  bool map_block(Block* to_map, std::size_t size) {
    ExpandableSegment& seg = *to_map->segment;
    const std::size_t begin = (to_map->addr - seg.base) / seg.page_bytes;
    const std::size_t end = (to_map->addr + size - seg.base + seg.page_bytes - 1) / seg.page_bytes;
    if (end <= begin) return false;
    const std::size_t mapped_bytes = (end - begin) * seg.page_bytes;
    if (reserved_bytes + mapped_bytes > opt.device_total_bytes) return false;  // cuMemCreate: OOM
    for (std::size_t i = begin; i < end; ++i) {
      if (seg.page_mapped[i]) invariant_failed("mapping a page that is already mapped");
      seg.page_mapped[i] = true;
    }
    seg.mapped_pages += end - begin;
    counters.creates += end - begin;
    counters.maps += end - begin;
    reserved_bytes += mapped_bytes;
    log(TraceAction::segment_map, to_map->addr, mapped_bytes);

    Pool& pool = *to_map->pool;
    pool.unmapped.erase(to_map);
    to_map->mapped = true;
    if (mapped_bytes < to_map->size) {
      Block* rest = new_block();
      rest->stream = to_map->stream;
      rest->size = to_map->size - mapped_bytes;
      rest->addr = to_map->addr + mapped_bytes;
      rest->pool = &pool;
      rest->segment = to_map->segment;
      rest->mapped = false;
      rest->prev = to_map;
      rest->next = to_map->next;
      if (rest->next) rest->next->prev = rest;
      to_map->next = rest;
      pool.unmapped.insert(rest);
      to_map->size = mapped_bytes;
    }
    try_merge_blocks(to_map, to_map->prev, pool);
    try_merge_blocks(to_map, to_map->next, pool);
    insert_free(pool, to_map);
    return true;
  }

  Block* try_allocate_expandable_block(std::uint64_t stream, Pool& pool, std::size_t size) {
    Block* c = find_expandable_block(stream, pool, size);
    if (!c->mapped && !map_block(c, std::min(c->size, size))) return nullptr;
    while (c->size < size) {
      // c is free and mapped, followed by unmapped space: map more and merge into it.
      Block* next = c->next;
      if (!next || next->mapped || next->allocated) invariant_failed("expandable growth without room");
      if (!map_block(next, std::min(size - c->size, next->size))) return nullptr;
      c = next;
    }
    pool.blocks.erase(c);
    return c;
  }

  // Unmaps the wholly free pages of a free expandable block; returns the unmapped block (after
  // merging with unmapped neighbours), or nullptr if no page was wholly free.
  Block* unmap_block(Block* b) {
    ExpandableSegment& seg = *b->segment;
    const std::size_t begin = (b->addr - seg.base + seg.page_bytes - 1) / seg.page_bytes;
    const std::size_t end = (b->addr + b->size - seg.base) / seg.page_bytes;
    if (begin >= end) return nullptr;
    Pool& pool = *b->pool;
    pool.blocks.erase(b);
    const std::uint64_t unmap_addr = seg.base + begin * seg.page_bytes;
    const std::size_t unmap_bytes = (end - begin) * seg.page_bytes;
    if (unmap_addr > b->addr) {
      Block* before = new_block();
      before->stream = b->stream;
      before->size = unmap_addr - b->addr;
      before->addr = b->addr;
      before->pool = &pool;
      before->segment = b->segment;
      before->prev = b->prev;
      before->next = b;
      if (before->prev) before->prev->next = before;
      b->prev = before;
      insert_free(pool, before);
    }
    const std::size_t after_bytes = b->addr + b->size - (unmap_addr + unmap_bytes);
    if (after_bytes > 0) {
      Block* after = new_block();
      after->stream = b->stream;
      after->size = after_bytes;
      after->addr = unmap_addr + unmap_bytes;
      after->pool = &pool;
      after->segment = b->segment;
      after->prev = b;
      after->next = b->next;
      if (after->next) after->next->prev = after;
      b->next = after;
      insert_free(pool, after);
    }
    b->addr = unmap_addr;
    b->size = unmap_bytes;
    b->mapped = false;
    try_merge_blocks(b, b->prev, pool);
    try_merge_blocks(b, b->next, pool);
    pool.unmapped.insert(b);
    for (std::size_t i = begin; i < end; ++i) seg.page_mapped[i] = false;
    seg.mapped_pages -= end - begin;
    counters.unmaps += end - begin;
    counters.releases += end - begin;
    reserved_bytes -= unmap_bytes;
    log(TraceAction::segment_unmap, unmap_addr, unmap_bytes);
    return b;
  }

  void release_expandable_segment(Block* b) {
    ExpandableSegment* seg = b->segment;
    if (b->size != seg->va_bytes || b->mapped) invariant_failed("releasing a segment that is not wholly unmapped");
    expandable_segments.erase(std::find(expandable_segments.begin(), expandable_segments.end(), seg));
    b->pool->unmapped.erase(b);
    delete_block(b);
  }

  // ---- merge ----
  std::size_t try_merge_blocks(Block* dst, Block* src, Pool& pool) {
    if (!src || src->allocated || dst->mapped != src->mapped) return 0;
    if (dst->prev == src) {  // [src dst]
      dst->addr = src->addr;
      dst->prev = src->prev;
      if (dst->prev) dst->prev->next = dst;
    } else {  // [dst src]
      dst->next = src->next;
      if (dst->next) dst->next->prev = dst;
    }
    const std::size_t subsumed = src->size;
    dst->size += subsumed;
    if (src->mapped) {
      pool.blocks.erase(src);
    } else {
      pool.unmapped.erase(src);
    }
    delete_block(src);
    return subsumed;
  }

  // ---- malloc / free ----
  std::optional<std::uint64_t> malloc(std::size_t orig_size, std::uint64_t stream) {
    Params p;
    p.stream = stream;
    p.size = round_size(orig_size);
    p.pool = &pool_for(p.size);
    p.alloc_size = allocation_size(p.size);
    bool found = get_free_block(p);
    if (!found) {
      if (gc_enabled()) garbage_collect_cached_blocks();
      found = alloc_block(p, false) || (release_available_cached_blocks(p) && alloc_block(p, false)) ||
              (release_cached_blocks() && alloc_block(p, true));
    }
    if (!found) return std::nullopt;
    Block* block = p.block;
    if (should_split(block, p.size)) {
      // The allocation takes the front; the remainder stays cached.
      Block* remaining = block;
      block = new_block();
      block->stream = stream;
      block->size = p.size;
      block->addr = remaining->addr;
      block->pool = remaining->pool;
      block->segment = remaining->segment;
      block->prev = remaining->prev;
      if (block->prev) block->prev->next = block;
      block->next = remaining;
      remaining->prev = block;
      remaining->addr += p.size;
      remaining->size -= p.size;
      insert_free(*remaining->pool, remaining);
    }
    block->allocated = true;
    block->requested = orig_size;
    live.emplace(block->addr, block);
    allocated_bytes += block->size;
    requested_bytes += orig_size;
    return block->addr;
  }

  bool free(std::uint64_t addr) {
    auto it = live.find(addr);
    if (it == live.end()) return false;
    Block* block = it->second;
    live.erase(it);
    block->allocated = false;
    allocated_bytes -= block->size;
    requested_bytes -= block->requested;
    block->requested = 0;
    Pool& pool = *block->pool;
    try_merge_blocks(block, block->prev, pool);
    try_merge_blocks(block, block->next, pool);
    insert_free(pool, block);
    return true;
  }

  std::uint64_t segment_count() const { return classic_segments + expandable_segments.size(); }

  WasteBreakdown breakdown() const {
    WasteBreakdown w;
    w.requested_bytes = requested_bytes;
    w.allocated_bytes = allocated_bytes;
    w.reserved_bytes = reserved_bytes;
    w.rounding_bytes = allocated_bytes - requested_bytes;
    for (const Pool* pool : {&small, &large}) {
      for (const Block* b : pool->blocks) {
        if (b->segment) {
          const ExpandableSegment& seg = *b->segment;
          const std::size_t first = (b->addr - seg.base + seg.page_bytes - 1) / seg.page_bytes;
          const std::size_t last = (b->addr + b->size - seg.base) / seg.page_bytes;
          const std::size_t whole = last > first ? (last - first) * seg.page_bytes : 0;
          w.cached_free_bytes += whole;
          w.partly_used_granule_bytes += b->size - whole;
        } else if (b->is_split()) {
          w.inactive_split_bytes += b->size;
        } else {
          w.cached_free_bytes += b->size;
        }
      }
    }
    return w;
  }

  void check() const {
    std::size_t free_mapped = 0;
    for (const Pool* pool : {&small, &large}) {
      for (const Block* b : pool->blocks) {
        if (b->allocated || !b->mapped) invariant_failed("a cached block is allocated or unmapped");
        if (b->pool != pool) invariant_failed("a block sits in another pool's set");
        for (const Block* n : {b->prev, b->next}) {
          if (n && !n->allocated && n->mapped == b->mapped) invariant_failed("two free neighbours were not merged");
        }
        if (b->prev && b->prev->addr + b->prev->size != b->addr) invariant_failed("blocks do not tile");
        if (b->next && b->addr + b->size != b->next->addr) invariant_failed("blocks do not tile");
        free_mapped += b->size;
      }
      for (const Block* b : pool->unmapped) {
        if (b->mapped || !b->segment) invariant_failed("an unmapped block is mapped or not expandable");
      }
    }
    std::size_t live_bytes = 0;
    for (const auto& [addr, b] : live) {
      if (!b->allocated || b->addr != addr) invariant_failed("the live map disagrees with a block");
      live_bytes += b->size;
    }
    if (live_bytes != allocated_bytes) invariant_failed("allocated bytes disagree with live blocks");
    if (free_mapped + allocated_bytes != reserved_bytes) invariant_failed("free + allocated != reserved");
  }
};

PytorchPolicy::PytorchPolicy(std::string name, PytorchModelOptions options)
    : name_(std::move(name)), model_(std::make_unique<Model>(options)) {}
PytorchPolicy::~PytorchPolicy() = default;

const std::string& PytorchPolicy::name() const noexcept { return name_; }

std::optional<std::uint64_t> PytorchPolicy::allocate(std::size_t requested_bytes, std::uint64_t stream) {
  return model_->malloc(requested_bytes, stream);
}

void PytorchPolicy::free(std::uint64_t addr) {
  if (!model_->free(addr)) invariant_failed("free of an address the model did not hand out");
}

std::size_t PytorchPolicy::allocated_bytes() const noexcept { return model_->allocated_bytes; }
std::size_t PytorchPolicy::reserved_bytes() const noexcept { return model_->reserved_bytes; }

PolicyCounters PytorchPolicy::counters() const {
  PolicyCounters c = model_->counters;
  c.segments = model_->segment_count();
  return c;
}

WasteBreakdown PytorchPolicy::breakdown() const { return model_->breakdown(); }

CallCosts PytorchPolicy::call_costs() const noexcept {
  return model_->opt.expandable_segments ? kH200VmmCosts : kH200CudaMallocCosts;
}

void PytorchPolicy::empty_cache() { model_->release_cached_blocks(); }

std::size_t PytorchPolicy::round_size(std::size_t requested_bytes) const noexcept {
  return model_->round_size(requested_bytes);
}

const PytorchModelOptions& PytorchPolicy::options() const noexcept { return model_->opt; }

void PytorchPolicy::prepare(const Trace& trace) {
  if (!model_->opt.use_trace_segment_addresses) return;
  model_->recorded_addresses.clear();
  for (const TraceEntry& e : trace.entries) {
    if (e.action == TraceAction::segment_alloc) model_->recorded_addresses[e.size_bytes].push_back(e.addr);
  }
}

void PytorchPolicy::record_segment_events(bool on) {
  model_->log_segments = on;
  model_->segment_log.clear();
}

const std::vector<ModelSegmentEvent>& PytorchPolicy::segment_events() const noexcept { return model_->segment_log; }

void PytorchPolicy::check_invariants() const { model_->check(); }

}  // namespace gpumem::forensics
