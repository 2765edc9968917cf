// Growth of an expandable region: where a request lands (placement), which wholly free pieces move
// there (recycling) and which pieces are created, of what length (growth_policy.h), then the driver
// calls. See Note [Physical page
// recycling] (docs/notes/physical-page-recycling.md) for the design and Note [Engine locking]
// (engine.h, docs/notes/engine-locking.md) for plan -> act -> commit:
//
//   plan    (engine lock) placement, recycling choice and plan_growth from growth_policy.h; the
//           pieces to recycle and the target range are claimed, so nobody else can use them.
//   act     (no engine lock) create pieces, synchronize the streams of the pieces that move, unmap
//           them, map every piece at its target slot. A new region's address space is reserved
//           the same way, before planning, with the lock dropped.
//   commit  (engine lock) record every piece unmapped or mapped, unclaim, carve the request out.
//           On failure nothing leaks: created pieces not mapped are destroyed, recycled pieces
//           that could not be placed are destroyed (their slots become unmapped), claims go back.
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <optional>
#include <utility>
#include <vector>

#include "engine.h"
#include "cap_policy.h"
#include "growth_policy.h"

namespace gpumem::alloc {

using detail::Block;
using detail::EventBatch;
using detail::GrowFailure;
using detail::PieceSlot;
using detail::Region;
using detail::RegionMap;

namespace {

// How many placements (besides those at a region's end) growth plans in full before choosing.
constexpr std::size_t kPlacementsPlanned = 8;

struct Placement {
  Region* region = nullptr;
  Block* hole_first = nullptr;  // the lowest block of the hole the placement lies in
  std::uintptr_t addr = 0;
  std::size_t need = 0;         // unmapped slots of the unit-aligned range [addr, addr + size)
};

// The unit-aligned slots a request at [addr, addr + size) covers.
policy::SlotRange unit_range(const Region& r, std::uintptr_t addr, std::size_t size, std::size_t unit) {
  const std::size_t first = r.slot_of(addr) / unit * unit;
  const std::size_t last = std::min((r.slot_of(addr + size - 1) / unit + 1) * unit, r.slot_count());
  return {first, last};
}

std::size_t unmapped_slots_in(const Region& r, policy::SlotRange range) {
  std::size_t n = 0;
  for (std::size_t s = range.lo; s < range.hi; ++s) n += r.slot_mapped(s) ? 0 : 1;
  return n;
}

bool is_hole_state(const Block* b) {
  return b && (b->state == BlockState::free || b->state == BlockState::unmapped);
}

// Every place `size` bytes could land in a region of (pool, stream): either end of each run of
// free and unmapped blocks ("hole").
void gather_placements(RegionMap& map, PoolKind pool, StreamId stream, std::size_t size, std::size_t unit,
                       std::vector<Placement>& places, std::vector<policy::PlacementCandidate>& candidates) {
  for (auto& [base, rp] : map.regions) {
    Region& r = *rp;
    if (!r.expandable || r.pool != pool || r.stream != stream) continue;
    std::uintptr_t last_hole_end = 0;
    for (Block& u : r.unmapped) {
      if (u.addr < last_hole_end) continue;  // in a hole seen already
      Block* lo = &u;
      while (is_hole_state(lo->prev)) lo = lo->prev;
      const Block* hi = &u;
      while (is_hole_state(hi->next)) hi = hi->next;
      last_hole_end = hi->end();
      const bool at_end = hi->end() == r.va.end();
      const policy::PlacementAddresses at = policy::placement_addresses(lo->addr, hi->end(), size);
      for (int i = 0; i < at.count; ++i) {
        const std::size_t need = unmapped_slots_in(r, unit_range(r, at.addr[i], size, unit));
        candidates.push_back({at.addr[i], need, hi->end() - lo->addr, at_end});
        places.push_back({&r, lo, at.addr[i], need});
      }
    }
  }
}

// How far past a request's slots growth looks for unmapped slots a recycled piece may overhang
// into (PieceRules::overhang): more than the longest adaptive piece.
constexpr std::size_t kOverhangScanSlots = 64;

// The maximal runs of unmapped slots in `range`, with whether their ends hold memory outside
// [addr, addr + size), and for the last, the unmapped slots after `range` (room_after): into `runs`.
void target_runs(const Region& r, policy::SlotRange range, std::uintptr_t addr, std::size_t size,
                 std::vector<policy::TargetRun>& runs) {
  runs.clear();
  const std::uintptr_t end = addr + size;
  for (std::size_t s = range.lo; s < range.hi;) {
    if (r.slot_mapped(s)) {
      ++s;
      continue;
    }
    std::size_t e = s + 1;
    while (e < range.hi && !r.slot_mapped(e)) ++e;
    policy::TargetRun run;
    run.slots = {s, e};
    run.head_shared = r.slot_addr(s) < addr;
    run.tail_shared = r.slot_addr(e) > end;
    if (e == range.hi)
      while (e + run.room_after < r.slot_count() && run.room_after < kOverhangScanSlots &&
             !r.slot_mapped(e + run.room_after))
        ++run.room_after;
    runs.push_back(run);
    s = e;
  }
}

// The driver work of one growth, as plain values: the act phase touches no engine structure.
struct GrowthWork {
  struct Piece {
    std::size_t bytes = 0;
    bool created = false;       // created here; else recycled: mapped at `from` now
    std::uintptr_t from = 0;
    PhysHandle handle = 0;      // recycled: its handle; created: set once created
    std::uintptr_t to = 0;      // where it is mapped
    bool keep_old = false;      // recycled: its mapping at `from` stays (a ghost), no unmap
    bool onto_ghost = false;    // recycled: `to` is one of its ghosts, still mapped: no call at all
    // Results.
    bool have = false;          // created, or unmapped from `from`
    bool mapped = false;        // mapped at `to`
    bool destroyed = false;     // had, but not mapped: destroyed
  };
  struct Ghost {
    std::uintptr_t va = 0;      // a kept mapping in the way of the growth: unmapped first
    std::size_t bytes = 0;
    bool unmapped = false;      // result
  };
  std::vector<StreamId> sync_streams;  // streams whose memory is unmapped or changes stream (synchronized first)
  std::vector<EventToken> wait_markers;  // recycle_wait:fence: markers of kept mappings in the way (waited for first)
  std::vector<Ghost> ghosts;
  std::vector<Piece> pieces;           // the created ones first, then the recycled ones
  GrowFailure fail;                    // status ok iff every step succeeded
  std::int64_t recycle_ns = 0;         // source time recycling took: its syncs, unmap and map calls

  // As a new one, except that these lists keep their capacity: every other member (one added
  // later included) gets its initial value.
  void reset() {
    GrowthWork fresh;
    fresh.sync_streams = cleared(sync_streams);
    fresh.ghosts = cleared(ghosts);
    fresh.pieces = cleared(pieces);
    *this = std::move(fresh);
  }
  template <class List>
  static List cleared(List& list) {
    list.clear();
    return std::move(list);
  }
};

// A wholly free piece that could move, with the block holding it.
struct PieceRef {
  Block* block;
  std::size_t first_slot;
  bool idle;  // fences show its memory idle on the GPU (always, without fences)
};

// The growth planned at one shortlisted place.
struct Planned {
  std::size_t place = 0;
  std::vector<policy::TargetRun> runs;
  std::uintptr_t claim_lo = 0, claim_hi = 0;  // the request and the slots it maps
  policy::GrowthLayout layout;                 // its recycled pieces index the growth's free pieces (refs)
};

void run_growth_unlocked(MemorySource& source, StreamEvents& events, GrowthWork& w) {
  auto fail_and_clean_up = [&](SourceStatus status) {
    w.fail.status = status;
    w.fail.detail = source.last_error();
    for (auto& p : w.pieces)
      if (p.have && !p.mapped) {
        source.destroy(p.handle);
        p.destroyed = true;
      }
  };
  // Create first: if the provider refuses, nothing has moved yet.
  for (auto& p : w.pieces) {
    if (!p.created) continue;
    auto h = source.create(p.bytes);
    if (!h.ok()) return fail_and_clean_up(h.status);
    p.handle = h.value;
    p.have = true;
  }
  // Recycling's work is timed (the recycle budget), the stream synchronizations it needs included:
  // the wait drains the stream's queue, which can cost more than the driver calls do. With no
  // recycling the clock is not read.
  const bool any_recycled =
      !w.ghosts.empty() || std::any_of(w.pieces.begin(), w.pieces.end(), [](const auto& p) { return !p.created; });
  std::int64_t t0 = any_recycled ? source.now_ns() : 0;
  // cuMemUnmap does not wait for kernels still using the range.
  for (StreamId s : w.sync_streams) events.synchronize_stream(s);
  for (EventToken m : w.wait_markers) events.synchronize(m);
  for (auto& g : w.ghosts) {
    const SourceStatus st = source.unmap(g.va, g.bytes);
    if (st != SourceStatus::ok) {
      w.recycle_ns += source.now_ns() - t0;
      return fail_and_clean_up(st);
    }
    g.unmapped = true;
  }
  for (auto& p : w.pieces) {
    if (p.created || p.keep_old) continue;
    const SourceStatus st = source.unmap(p.from, p.bytes);
    if (st != SourceStatus::ok) {
      w.recycle_ns += source.now_ns() - t0;
      return fail_and_clean_up(st);
    }
    p.have = true;
  }
  if (any_recycled) w.recycle_ns += source.now_ns() - t0;
  for (auto& p : w.pieces) {
    if (p.onto_ghost) {  // still mapped there
      p.mapped = true;
      continue;
    }
    if (!p.created) t0 = source.now_ns();
    const SourceStatus st = source.map(p.to, p.bytes, p.handle);
    if (!p.created) w.recycle_ns += source.now_ns() - t0;
    if (st != SourceStatus::ok) return fail_and_clean_up(st);
    p.mapped = true;
  }
}

}  // namespace

namespace detail {

// Every list one growth builds (see grow_expandable_dropping_lock for what each holds). The
// engine keeps one, under growth_mutex; each growth clears what it uses.
struct GrowthScratch {
  std::vector<Placement> places;
  std::vector<policy::PlacementCandidate> candidates;
  std::vector<PieceRef> refs;
  std::vector<policy::FreePiece> all_pieces;
  std::vector<std::size_t> shortlist;  // indices into places, planned in full
  // Planned growths: those of the last plan, and the two sets kept aside while the headroom and
  // budget rules compare plans (swapped, so every set keeps its entries' lists).
  std::vector<Planned> planned, planned_aside, planned_aside2;
  std::vector<policy::GrowthOption> options, options_aside, options_aside2;
  // The free pieces in recycling's order, once per growth, and the pieces each plan leaves out.
  policy::RecyclePlanner planner;
  std::vector<std::uint8_t> skip;
  GrowthWork work;
  std::vector<policy::RecycleChoice> choices;
  std::vector<std::size_t> order;
  std::vector<Block*> recycled;
  std::vector<RegionMap::GhostRef> ghost_at;
  std::vector<Block*> target;
  std::vector<std::pair<StreamId, EventToken>> markers;
};

void GrowthScratchDelete::operator()(GrowthScratch* s) const noexcept { delete s; }

}  // namespace detail

CachingAllocator::Impl::Block* CachingAllocator::Impl::grow_expandable_dropping_lock(
    Lock& lock, PoolKind pool, StreamId stream, std::size_t rounded, EventBatch& batch, GrowFailure& fail,
    bool over_budget_ok, bool may_sync) {
  growth_mutex.assert_held();
  mutex.assert_held();
  const int p = static_cast<int>(pool);
  const std::size_t slot = rules.slot_bytes;
  const policy::PieceRules pieces = policy::piece_rules_for_footprint(rules.pieces[p], piece_footprint_bytes(), slot);
  const std::size_t unit = policy::unit_slots(pieces);

  if (!growth_scratch) growth_scratch.reset(new detail::GrowthScratch);
  detail::GrowthScratch& scratch = *growth_scratch;

  // ---- plan
  // recycle_wait:fence (Note [Physical page recycling], "Fences instead of waits"): a move that
  // needs memory idle on the GPU takes only memory the fences show idle, so nothing below waits;
  // may_sync is the fallback past the cap or the provider, which waits as recycle_wait:sync does.
  const bool fence = rules.recycle_fence && !may_sync && may_wait();
  bool fence_limited = false;     // a piece was passed over: not known idle
  std::uint64_t fence_skips = 0;  // how many (gpumem.num_recycle_fence_skips)
  const std::uint64_t plan_tick = map.tick;
  if (fence) fences.poll(events);
  std::vector<Placement>& places = scratch.places;
  std::vector<policy::PlacementCandidate>& candidates = scratch.candidates;
  places.clear();
  candidates.clear();
  gather_placements(map, pool, stream, rounded, unit, places, candidates);
  if (!may_wait() && !map.ghosts.empty()) {
    // Capturing: a kept mapping in the way would have to be unmapped, which waits for its stream
    // (not allowed now): only places whose slots hold none (a new region if there is no such place).
    std::size_t kept = 0;
    for (std::size_t i = 0; i < places.size(); ++i) {
      const Region& pr = *places[i].region;
      const policy::SlotRange u = unit_range(pr, places[i].addr, rounded, unit);
      bool clear = true;
      for (std::size_t s = u.lo; s < u.hi && clear; ++s) clear = !pr.slot_ghost(s);
      if (!clear) continue;
      places[kept] = places[i];
      candidates[kept] = candidates[i];
      ++kept;
    }
    places.resize(kept);
    candidates.resize(kept);
  }
  if (places.empty()) {
    if (rounded > rules.region_va_bytes[p]) {
      fail.status = SourceStatus::out_of_memory;
      fail.detail = fmt::format("the request is larger than the address space of a region ({} bytes)",
                                rules.region_va_bytes[p]);
      return nullptr;
    }
    // A new region. Expandable regions are aligned to a power of two at least a unit (sources
    // take only powers of two); slots are counted from the region's base, so any alignment would
    // be correct.
    lock.unlock();
    const auto reserved = source.reserve(rules.region_va_bytes[p], std::bit_ceil(slot * unit));
    const std::string error = reserved.ok() ? std::string() : source.last_error();
    lock.lock();
    if (!reserved.ok()) {
      fail.status = reserved.status;
      fail.detail = error;
      return nullptr;
    }
    Region* r = map.add_region(reserved.value, pool, stream, true, slot);
    const std::size_t need = unit_range(*r, r->va.base, rounded, unit).size();
    places.push_back({r, r->first, r->va.base, need});
    candidates.push_back({r->va.base, need, r->va.size_bytes, true});
  }

  // Wholly free pieces that could move (the growing pool's, and the other pool's when the rules
  // allow it), each with the block holding it.
  std::vector<PieceRef>& refs = scratch.refs;
  std::vector<policy::FreePiece>& all_pieces = scratch.all_pieces;
  refs.clear();
  all_pieces.clear();
  // Recycling synchronizes the streams of the pieces that move: never while capturing or holding
  // (Note [Engine during graph capture]).
  const bool may_recycle = rules.recycle && may_release();
  // The recycle budget (recycle_budget_policy.h): once moving pieces has taken its share of the
  // time, growth creates instead, unless that would pass the cap (below) or the provider refuses
  // (the retry at the end).
  bool recycle_now = may_recycle && (over_budget_ok || recycle_budget.rules().unlimited() ||
                                     recycle_budget.allows(recycle_budget.rules().none() ? 0 : source.now_ns()));
  if (may_recycle) {
    for (int q = 0; q < 2; ++q) {
      if (q != p && !pieces.recycle_across_pools) continue;
      // Only a block of a slot or more can hold a wholly free piece: the smaller ones (most free
      // blocks) are not visited; the order of the others is that of blocks().
      for (Block& b : map.free_index[q].blocks_from(slot)) {
        const Region& br = *b.region;
        if (!br.expandable || b.size_bytes < br.slot_bytes || br.slot_bytes != slot) continue;
        for (std::size_t s = br.slot_of(b.addr + br.slot_bytes - 1); s < br.slot_count() && br.slot_addr(s) < b.end();) {
          if (!br.slot_mapped(s)) break;  // cannot happen inside a free block
          const std::size_t f = br.piece_first(s), n = br.piece_slots(s);
          const std::uintptr_t lo = br.slot_addr(f);
          const bool idle = !fence || fences.idle(br.stream, b.free_seq);
          // With fences, a piece not known idle moves only where it needs no wait: kept mappings
          // on, staying on its stream (nothing is unmapped; its last uses are ordered before the
          // next on that stream). Others wait for a fence, recorded now if none covers them.
          const bool movable = idle || (rules.keep_mappings && br.stream == stream);
          if (f == s && lo + n * slot <= b.end() && !movable) {
            fences.cover(events, br.stream, b.free_seq, map.tick);
            ++fence_skips;
            fence_limited = true;
          } else if (f == s && lo + n * slot <= b.end()) {
            const bool edge = f == 0 || !br.slot_mapped(f - 1) || f + n >= br.slot_count() || !br.slot_mapped(f + n);
            refs.push_back({&b, f, idle});
            all_pieces.push_back({n, b.size_bytes, br.stream, lo, edge});
          }
          s = f + n;
        }
      }
    }
  }

  // Plan the growth at the most promising places; take the best.
  std::vector<Planned>& planned = scratch.planned;
  std::vector<policy::GrowthOption>& options = scratch.options;
  std::vector<std::uint8_t>& skip = scratch.skip;
  std::vector<std::size_t>& shortlist = scratch.shortlist;
  policy::shortlist_placements(candidates, kPlacementsPlanned, shortlist);
  // The order in which recycling takes the free pieces is the same at every place: sorted once,
  // at the first plan that recycles (RecyclePlanner, growth_policy.h).
  bool pieces_ordered = false;
  // Plans the growth at each shortlisted place (with or without recycling); the best one's index.
  // planned[k] is the plan at shortlist[k]; entries are reused with their lists.
  auto plan_all = [&](bool recycle) {
    planned.resize(shortlist.size());
    options.clear();
    if (recycle && !pieces_ordered) {
      scratch.planner.prepare(all_pieces, pieces);
      pieces_ordered = true;
    }
    for (std::size_t k = 0; k < shortlist.size(); ++k) {
      const std::size_t i = shortlist[k];
      const Placement& pl = places[i];
      const Region& r = *pl.region;
      // A new plan, its lists reused (every other member, one added later included, starts from
      // its initial value).
      Planned& x = planned[k];
      {
        Planned fresh;
        fresh.runs = std::move(x.runs);
        fresh.layout.recycled = std::move(x.layout.recycled);
        fresh.layout.created = std::move(x.layout.created);
        x = std::move(fresh);
      }
      x.place = i;
      target_runs(r, unit_range(r, pl.addr, rounded, unit), pl.addr, rounded, x.runs);
      x.claim_lo = pl.addr;
      x.claim_hi = pl.addr + rounded;
      if (!x.runs.empty()) {
        x.claim_lo = std::min(x.claim_lo, r.slot_addr(x.runs.front().slots.lo));
        x.claim_hi = std::max(x.claim_hi, r.slot_addr(x.runs.back().slots.hi));
      }
      // The free pieces offered: none where no slot is needed, else all but those where the
      // request lands (skipped).
      bool any_skipped = false;
      if (recycle && pl.need > 0) {
        skip.resize(refs.size());
        for (std::size_t k = 0; k < refs.size(); ++k) {
          const policy::FreePiece& fp = all_pieces[k];
          const bool inside =
              refs[k].block->region == &r && fp.addr < x.claim_hi && fp.addr + fp.slots * slot > x.claim_lo;
          skip[k] = inside ? 1 : 0;
          any_skipped |= inside;
        }
      }
      scratch.planner.plan(any_skipped ? std::span<const std::uint8_t>(skip) : std::span<const std::uint8_t>(),
                           x.runs, pieces, recycle && pl.need > 0, x.layout);
      for (const policy::SlotRange& c : x.layout.created) x.claim_hi = std::max(x.claim_hi, r.slot_addr(c.hi));
      for (const policy::RecycleChoice& c : x.layout.recycled)  // an overhanging piece ends past the runs
        x.claim_hi = std::max(x.claim_hi, r.slot_addr(c.target_slot + all_pieces[c.piece].slots));
      options.push_back({x.layout.created_slots(),
                         x.layout.created.size() + x.layout.recycled.size(), candidates[i].hole_bytes, pl.addr});
    }
    return *policy::choose_growth(options);
  };
  std::size_t chosen = plan_all(recycle_now);
  const bool budget_denied = may_recycle && !recycle_now;
  in_use_high_bytes = std::max(in_use_high_bytes, allocated_bytes + pending_bytes + rounded);
  // The headroom rule (recycle_budget_policy.h, within_headroom): a growth that would move pieces
  // creates instead while the footprint stays within the headroom over the most memory ever in use.
  bool headroom_create = false;
  if (recycle_now && !over_budget_ok && rules.recycle_headroom > 0 && !planned[chosen].layout.recycled.empty()) {
    const std::size_t chosen_with = chosen;
    std::vector<Planned>& planned_with = scratch.planned_aside;
    std::vector<policy::GrowthOption>& options_with = scratch.options_aside;
    planned_with.swap(planned);
    options_with.swap(options);
    const std::size_t chosen_without = plan_all(false);
    const std::size_t adding = planned[chosen_without].layout.created_slots() * slot;
    if (policy::within_headroom(map.reserved_bytes, adding, in_use_high_bytes, rules.recycle_headroom) &&
        !policy::exceeds_cap(map.reserved_bytes, adding, cap)) {
      chosen = chosen_without;
      recycle_now = false;
      headroom_create = true;
    } else {
      planned.swap(planned_with);
      options.swap(options_with);
      chosen = chosen_with;
    }
  }
  // Growth past the budget creates what it could have recycled: the memory the budget buys (the
  // slots created beyond what the same growth with recycling would create).
  std::size_t buying_bytes = 0;
  const std::size_t bought_bytes =
      policy::bought_estimate(recycle_budget_bought_bytes, map.reserved_bytes, in_use_high_bytes);
  if (budget_denied && !refs.empty()) {
    const std::size_t without = planned[chosen].layout.created_slots();
    const std::size_t chosen_without = chosen;
    std::vector<Planned>& planned_without = scratch.planned_aside2;
    std::vector<policy::GrowthOption>& options_without = scratch.options_aside2;
    planned_without.swap(planned);
    options_without.swap(options);
    const std::size_t chosen_with = plan_all(true);
    const std::size_t with = planned[chosen_with].layout.created_slots();
    buying_bytes = (without - std::min(without, with)) * slot;
    // Memory comes first: past the cap, or past the memory the budget may add (its slack, against
    // the estimate of what it bought so far), growth recycles whatever it costs; that recycling is
    // not charged (the budget counts what it chose).
    // The churn allowance's clock is read only for a growth the usual bounds refuse.
    const policy::GuardInputs guard{.bought_bytes = bought_bytes,
                                    .buying_bytes = buying_bytes,
                                    .created_bytes = without * slot,
                                    .reserved_bytes = map.reserved_bytes,
                                    .in_use_high_bytes = in_use_high_bytes,
                                    .cap_bytes = cap};
    if (policy::guard_forces_recycling(guard, rules.recycle_budget,
                                       [&] { return churn_open_locked(source.now_ns()); })) {
      recycle_now = true;
      chosen = chosen_with;
      buying_bytes = 0;
    } else {
      planned.swap(planned_without);
      options.swap(options_without);
      chosen = chosen_without;
    }
  }
  const bool charge_budget = !budget_denied;
  // Frontier pieces (growth_policy.h): the chosen growth's new pieces, longer where it only builds.
  policy::lengthen_frontier_pieces_in_place(planned[chosen].layout, planned[chosen].runs,
                                            candidates[planned[chosen].place].at_region_end, pieces);
  const Planned& best = planned[chosen];
  const Placement* place = &places[best.place];
  Region& r = *place->region;
  const std::uintptr_t claim_lo = best.claim_lo, claim_hi = best.claim_hi;
  const policy::GrowthLayout& layout = best.layout;
  // The layout's pieces index the growth's free pieces: refs and all_pieces.
  const std::vector<PieceRef>& candidates_refs = refs;
  const std::vector<policy::FreePiece>& free_pieces = all_pieces;
  // Memory comes first: what fences passed over is created instead only while the footprint stays
  // within what recycling alone reserves at least (policy::fence_may_create); past it, wait.
  if (fence_limited && !policy::fence_may_create(map.reserved_bytes, layout.created_slots() * slot, in_use_high_bytes))
    return grow_expandable_dropping_lock(lock, pool, stream, rounded, batch, fail, over_budget_ok, /*may_sync=*/true);
  if (policy::exceeds_cap(map.reserved_bytes, layout.created_slots() * slot, cap)) {
    // What fences passed over may be what keeps the growth within the cap: plan again, waiting.
    if (fence_limited)
      return grow_expandable_dropping_lock(lock, pool, stream, rounded, batch, fail, over_budget_ok, /*may_sync=*/true);
    fail.cap_reached = true;
    fail.status = SourceStatus::out_of_memory;
    return nullptr;
  }

  GrowthWork& w = scratch.work;
  w.reset();
  for (const policy::SlotRange& c : layout.created) {
    GrowthWork::Piece piece;
    piece.bytes = c.size() * slot;
    piece.to = r.slot_addr(c.lo);
    piece.created = true;
    w.pieces.push_back(piece);
  }
  // Kept mappings (block.h): among the pieces this growth moves, those of one length are
  // interchangeable, so each goes, where it can, to a target slot that holds its own kept mapping
  // (a move there makes no driver call). Only which handle goes where changes: the slots mapped,
  // the pieces freed and every later decision are those of the plan.
  std::vector<policy::RecycleChoice>& choices = scratch.choices;
  choices.assign(layout.recycled.begin(), layout.recycled.end());
  if (rules.keep_mappings && r.ghosts > 0) {
    auto handle_of = [&](std::size_t piece) {
      const PieceRef& ref = candidates_refs[piece];
      return ref.block->region->slots[ref.first_slot].handle;
    };
    for (std::size_t i = 0; i < choices.size(); ++i) {
      const std::size_t t = choices[i].target_slot, n = free_pieces[choices[i].piece].slots;
      if (!r.slot_ghost(t) || r.slots[t].ghost_first != t || r.slots[t].ghost_count != n) continue;
      if (handle_of(choices[i].piece) == r.slots[t].ghost) continue;  // already its own
      for (std::size_t j = 0; j < choices.size(); ++j) {
        if (j == i || handle_of(choices[j].piece) != r.slots[t].ghost) continue;
        // Piece j has its kept mapping at t: swap unless j already sits on its own kept mapping.
        const std::size_t tj = choices[j].target_slot;
        const bool j_home = r.slot_ghost(tj) && r.slots[tj].ghost_first == tj && r.slots[tj].ghost == handle_of(choices[j].piece);
        if (!j_home) std::swap(choices[i].piece, choices[j].piece);
        break;
      }
    }
  }
  // Claim the pieces to recycle, the highest first: claim_piece keeps the part of the block below
  // the piece in the same Block, so a lower piece of the same free block is still found through it.
  std::vector<std::size_t>& order = scratch.order;
  order.resize(choices.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return free_pieces[choices[a].piece].addr > free_pieces[choices[b].piece].addr;
  });
  std::vector<Block*>& recycled = scratch.recycled;  // parallel to the recycled entries of w.pieces
  recycled.clear();
  auto note_sync = [&](StreamId s) {
    if (std::find(w.sync_streams.begin(), w.sync_streams.end(), s) == w.sync_streams.end()) w.sync_streams.push_back(s);
  };
  for (std::size_t i : order) {
    const policy::RecycleChoice& c = choices[i];
    const PieceRef& cand = candidates_refs[c.piece];
    Region& from = *cand.block->region;
    GrowthWork::Piece piece;
    piece.bytes = free_pieces[c.piece].slots * slot;
    piece.from = free_pieces[c.piece].addr;
    piece.handle = from.slots[cand.first_slot].handle;
    piece.to = r.slot_addr(c.target_slot);
    const std::size_t n = free_pieces[c.piece].slots;
    piece.onto_ghost = rules.keep_mappings && r.slot_ghost(c.target_slot) && r.slots[c.target_slot].ghost == piece.handle &&
                       r.slots[c.target_slot].ghost_first == c.target_slot && r.slots[c.target_slot].ghost_count == n;
    w.pieces.push_back(piece);
    recycled.push_back(map.claim_piece(cand.block, cand.first_slot));
  }
  // Kept mappings to unmap: those where pieces land (other than a piece's own), and old ones evicted
  // below. Unmapping one waits for its region's stream (kernels may still use it from before its
  // piece moved) unless the marker recorded when it was made has completed.
  std::vector<RegionMap::GhostRef>& ghost_at = scratch.ghost_at;  // parallel to w.ghosts (region, first slot)
  ghost_at.clear();
  auto unmap_ghost = [&](Region& gr, std::size_t g) {
    for (const RegionMap::GhostRef& x : ghost_at)
      if (x.region == &gr && x.first == g) return std::size_t{0};
    const std::size_t bytes = gr.slots[g].ghost_count * gr.slot_bytes;
    const EventToken m = map.ghost_marker(gr, g);
    ghost_at.push_back({&gr, g, 0, m});
    w.ghosts.push_back({gr.slot_addr(g), bytes, false});
    // Its marker says when the uses of its old place are done: with fences, wait for that marker
    // alone (the work queued after it keeps running), else for the whole stream.
    if (m != 0 && fence) {
      if (std::find(w.wait_markers.begin(), w.wait_markers.end(), m) == w.wait_markers.end() && !events.query(m))
        w.wait_markers.push_back(m);
    } else if (m == 0 || !events.query(m)) {
      note_sync(gr.stream);
    }
    return bytes;
  };
  std::size_t unmapping_bytes = 0;
  for (const GrowthWork::Piece& piece : w.pieces) {
    if (piece.onto_ghost) continue;
    const std::size_t first = r.slot_of(piece.to), n = piece.bytes / slot;
    for (std::size_t s2 = first; s2 < first + n; ++s2)
      if (r.slot_ghost(s2)) unmapping_bytes += unmap_ghost(r, r.slots[s2].ghost_first);
  }
  // A move keeps its old mapping while kept mappings stay within the physical footprint (so their
  // number stays bounded however long recycling goes on); to make room, the oldest kept mappings
  // whose markers have completed are unmapped (no wait); past that, a move unmaps its old place as
  // before. A move onto its own kept mapping trades one kept mapping for another.
  std::size_t keep_room = map.reserved_bytes + unmapping_bytes > map.ghost_bytes
                              ? map.reserved_bytes + unmapping_bytes - map.ghost_bytes
                              : 0;
  map.trim_ghost_ages();
  std::size_t age = 0;
  constexpr std::size_t kEvictionScan = 256;  // kept mappings looked at per growth, oldest first
  auto lands_on_own = [&](const Region& gr, std::size_t g) {
    if (&gr != &r) return false;
    for (const GrowthWork::Piece& piece : w.pieces)
      if (piece.onto_ghost && r.slot_of(piece.to) == g) return true;
    return false;
  };
  const std::size_t created_pieces = layout.created.size();
  for (std::size_t k = 0; k < recycled.size(); ++k) {
    GrowthWork::Piece& piece = w.pieces[created_pieces + k];
    const Region& from = *recycled[k]->region;
    if (rules.keep_mappings && !piece.onto_ghost)
      while (piece.bytes > keep_room && age < map.ghost_ages.size() && age < kEvictionScan) {
        const RegionMap::GhostAge a = map.ghost_ages[age++];
        Region& gr = *a.region;
        if (!gr.slot_ghost(a.first) || gr.slots[a.first].ghost_first != a.first || gr.slots[a.first].ghost != a.handle ||
            lands_on_own(gr, a.first))
          continue;
        const EventToken m = map.ghost_marker(gr, a.first);
        if (m == 0 || !events.query(m)) break;  // the rest are younger
        keep_room += unmap_ghost(gr, a.first);
      }
    piece.keep_old = piece.onto_ghost || (rules.keep_mappings && piece.bytes <= keep_room);
    if (piece.keep_old && !piece.onto_ghost) keep_room -= piece.bytes;
    // Unmapping needs the piece's stream idle (cuMemUnmap does not wait for kernels); a piece that
    // stays mapped needs it only when it changes stream (as any cached block would: a free block's
    // last uses are ordered on its own stream).
    if (!piece.keep_old || from.stream != r.stream) {
      // A piece fences do not show idle stays mapped where it was, on its stream (above), unless
      // kept mappings have no room left: then it waits, as it would without fences.
      if (!candidates_refs[choices[order[k]].piece].idle || !fence) note_sync(from.stream);
    }
  }
  // ... and the target.
  std::vector<Block*>& target = scratch.target;
  target.clear();
  map.claim_range(place->hole_first, claim_lo, claim_hi, target);

  // ---- act
  lock.unlock();
  run_growth_unlocked(source, events, w);
  lock.lock();

  // ---- commit
  // Each stream synchronized is idle up to the plan's tick (every free before it was queued before).
  for (StreamId s : w.sync_streams) fences.synchronized(s, plan_tick);
  if (StatsObserver* sink = stats_sink.load(std::memory_order_relaxed))
    sink->count_recycle_waits(w.sync_streams.size(), w.wait_markers.size(), fence_skips);
  if (charge_budget) recycle_budget.charge(w.recycle_ns);
  if (w.recycle_ns > 0 && rules.recycle_budget.churn > 0.0) churn.note_recycling(source.now_ns(), w.recycle_ns);
  if (w.fail.status == SourceStatus::ok) recycle_budget_bought_bytes += buying_bytes;
  for (std::size_t i = 0; i < w.ghosts.size(); ++i)
    if (w.ghosts[i].unmapped)
      if (const EventToken m = map.remove_ghost(*ghost_at[i].region, ghost_at[i].first)) events.release(m);
  // One marker per stream that pieces moved away from keeping their old mappings: it completes once
  // the work queued there so far (all uses of the old places) is done.
  std::vector<std::pair<StreamId, EventToken>>& markers = scratch.markers;
  markers.clear();
  auto marker_for = [&](StreamId st) {
    for (const auto& [ms, m] : markers)
      if (ms == st) return m;
    markers.emplace_back(st, events.record(st));
    return markers.back().second;
  };
  const std::size_t created = layout.created.size();
  for (std::size_t i = 0; i < recycled.size(); ++i) {
    const GrowthWork::Piece& piece = w.pieces[created + i];
    Block* b = recycled[i];
    const bool moved = piece.keep_old ? piece.mapped : piece.have;
    if (!moved) {
      map.unclaim(b);  // never unmapped (or, kept, never mapped elsewhere): still free memory here
      continue;
    }
    Region& from = *b->region;
    const std::size_t from_first = from.slot_of(piece.from);
    map.record_piece_unmapped(b);
    if (piece.keep_old)  // still mapped there
      map.add_ghost(from, from_first, piece.bytes / slot, piece.handle, marker_for(from.stream));
    if (piece.destroyed) map.reserved_bytes -= piece.bytes;
    emit(batch, EventKind::segment_unmap, from.pool, piece.from, piece.bytes, 0, from.stream, piece.destroyed ? 1 : 0);
  }
  for (const GrowthWork::Piece& piece : w.pieces) {
    if (!piece.mapped) continue;
    if (piece.onto_ghost)  // its kept mapping is the piece's again
      if (const EventToken m = map.remove_ghost(r, r.slot_of(piece.to))) events.release(m);
    map.record_piece_mapped(r, r.slot_of(piece.to), piece.bytes / slot, piece.handle);
    if (piece.created) map.reserved_bytes += piece.bytes;
    emit(batch, EventKind::segment_map, r.pool, piece.to, piece.bytes, 0, r.stream, piece.created ? 1 : 0);
  }
  Block* merged = nullptr;
  for (Block* b : target)
    if (Block* f = map.unclaim(b)) merged = f;
  if (w.fail.status != SourceStatus::ok) {
    // The budget (or the headroom rule) kept this growth from recycling and the provider had no
    // memory for it: try once more with recycling (created pieces were destroyed, so the state is
    // as before the growth).
    if ((buying_bytes > 0 || headroom_create) && w.fail.status == SourceStatus::out_of_memory)
      return grow_expandable_dropping_lock(lock, pool, stream, rounded, batch, fail, /*over_budget_ok=*/true, may_sync);
    // Fences kept this growth from moving pieces not known idle and the provider had no memory for
    // it: once more, waiting for them.
    if (fence_limited && w.fail.status == SourceStatus::out_of_memory)
      return grow_expandable_dropping_lock(lock, pool, stream, rounded, batch, fail, over_budget_ok, /*may_sync=*/true);
    fail = std::move(w.fail);
    return nullptr;
  }
  // Every slot of [addr, addr + rounded) is mapped and free now: one free block holds the range.
  const std::uintptr_t ex_lo = place->addr, ex_hi = place->addr + rounded;
  if (!merged || merged->addr > ex_lo || merged->end() < ex_hi)
    detail::invariant_failed("growth placement is not free memory");
  map.index_of(r).erase(*merged);
  return map.carve(merged, ex_lo, rounded);
}

}  // namespace gpumem::alloc
