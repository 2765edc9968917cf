// The caching engine on SimSource: rounding, pools, splitting and merging, expandable growth,
// physical page recycling, classic segments, record_stream, caps and OOM, misuse, observers.
#include <map>
#include <memory>
#include <random>
#include <array>
#include <vector>

#include "catch.h"
#include "gpumem/alloc/caching_allocator.h"
#include "gpumem/alloc/forwarding_source.h"
#include "gpumem/alloc/manual_stream_events.h"
#include "gpumem/alloc/sim_source.h"
#include "slow_source.h"

using namespace gpumem::alloc;

namespace {

constexpr std::size_t KiB = 1024;
constexpr std::size_t MiB = 1024 * 1024;

// The engine cases below count pieces of PyTorch's 20 MiB pages (pieces:fixed); the adaptive
// pieces of the default have their own cases ("adaptive pieces ...").
Config test_config(bool expandable = true) {
  Config c;
  c.expandable_segments = expandable;
  c.pieces = PieceSizing::fixed;
  // The cases below check piece mechanics with max_piece_size_mb's pieces at footprints of tens of
  // MiB, where footprint_pieces (the default's 512) would make every piece one slot; its own case
  // is "footprint_pieces: pieces grow with the footprint".
  c.footprint_pieces = 0;
  c.check_invariants = true;
  c.va_reserve_bytes = 1024 * MiB;
  return c;
}

struct Recorder final : AllocObserver {
  std::vector<AllocEvent> events;
  void on_events(std::span<const AllocEvent> batch) override { events.insert(events.end(), batch.begin(), batch.end()); }
  std::size_t count(EventKind k) const {
    std::size_t n = 0;
    for (const auto& e : events) n += e.kind == k;
    return n;
  }
};

struct Fixture {
  explicit Fixture(Config c = test_config(), SimSourceOptions o = {})
      : source(o), events(make_immediate_events()), engine(source, *events, c) {}
  SimSource source;
  std::unique_ptr<StreamEvents> events;
  CachingAllocator engine;

  void* alloc(std::size_t n, StreamId s = 0) {
    auto r = engine.allocate(n, s);
    REQUIRE(r.ok());
    REQUIRE(r.ptr != nullptr);
    return r.ptr;
  }
};

}  // namespace

TEST_CASE("requests are rounded to 512 bytes and routed to the small or large pool", "[engine]") {
  Fixture f;
  CHECK(f.engine.round_size(1) == 512);
  CHECK(f.engine.round_size(512) == 512);
  CHECK(f.engine.round_size(513) == 1024);
  CHECK(f.engine.round_size(MiB + 1) == MiB + 512);
  auto small = f.engine.allocate(1000, 0);
  REQUIRE(small.ok());
  CHECK(small.size_bytes == 1024);
  auto large = f.engine.allocate(3 * MiB, 0);
  REQUIRE(large.ok());
  auto snap = f.engine.snapshot();
  REQUIRE(snap.segments.size() == 2);
  std::map<PoolKind, std::size_t> mapped;
  for (const auto& s : snap.segments) mapped[s.pool] = s.mapped_bytes;
  CHECK(mapped[PoolKind::small] == 2 * MiB);   // one 2 MiB piece
  CHECK(mapped[PoolKind::large] == 20 * MiB);  // one 20 MiB piece
  CHECK(f.engine.totals().allocated_bytes == 1024 + 3 * MiB);
  CHECK(f.engine.totals().requested_bytes == 1000 + 3 * MiB);
  CHECK(f.engine.free(small.ptr) == FreeStatus::ok);
  CHECK(f.engine.free(large.ptr) == FreeStatus::ok);
  CHECK(f.engine.totals().allocated_bytes == 0);
}

TEST_CASE("roundup_power2_divisions rounds to the next division", "[engine]") {
  Config c = test_config();
  c.roundup_power2_divisions.fill(4);
  Fixture f(c);
  // 1.1 MiB with 4 divisions between 1 and 2 MiB -> 1.25 MiB
  CHECK(f.engine.round_size(MiB + 100 * KiB) == MiB + 256 * KiB);
  CHECK(f.engine.round_size(2 * MiB) == 2 * MiB);
  // small sizes at or under 512 x divisions stay at 512-byte rounding
  CHECK(f.engine.round_size(1500) == 1536);
}

TEST_CASE("a freed block is reused and neighbours merge back", "[engine]") {
  Fixture f;
  void* a = f.alloc(4 * KiB);
  void* b = f.alloc(4 * KiB);
  void* c = f.alloc(4 * KiB);
  CHECK(reinterpret_cast<std::uintptr_t>(b) == reinterpret_cast<std::uintptr_t>(a) + 4 * KiB);
  REQUIRE(f.engine.free(b) == FreeStatus::ok);
  void* b2 = f.alloc(4 * KiB);
  CHECK(b2 == b);  // best fit: the hole exactly
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  REQUIRE(f.engine.free(b2) == FreeStatus::ok);
  REQUIRE(f.engine.free(c) == FreeStatus::ok);
  auto snap = f.engine.snapshot();
  REQUIRE(snap.segments.size() == 1);
  REQUIRE(snap.segments[0].blocks.size() >= 1);
  // Everything mapped is one free block again.
  std::size_t free_blocks = 0;
  for (const auto& blk : snap.segments[0].blocks) free_blocks += blk.state == BlockState::free;
  CHECK(free_blocks == 1);
  CHECK(f.source.counters().maps == 1);
}

TEST_CASE("streams keep their own cached blocks", "[engine]") {
  Fixture f;
  void* a = f.alloc(64 * KiB, 1);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  void* b = f.alloc(64 * KiB, 2);
  CHECK(b != a);
  auto sizes = f.engine.expandable_region_sizes();
  CHECK(sizes.size() == 2);
}

TEST_CASE("expandable regions grow piece by piece and serve sizes of any length", "[engine]") {
  Fixture f;
  void* a = f.alloc(50 * MiB);  // 3 pieces of 20 MiB
  CHECK(f.source.counters().maps == 3);
  CHECK(f.engine.totals().reserved_bytes == 60 * MiB);
  void* b = f.alloc(10 * MiB);  // fits in the 10 MiB left in the third piece
  CHECK(f.source.counters().maps == 3);
  CHECK(reinterpret_cast<std::uintptr_t>(b) == reinterpret_cast<std::uintptr_t>(a) + 50 * MiB);
  void* c = f.alloc(1 * MiB + 512);  // 20 MiB more mapped after b
  CHECK(f.source.counters().maps == 4);
  for (void* p : {a, b, c}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  CHECK(f.engine.totals().reserved_bytes == 80 * MiB);  // cached, not released
  f.engine.empty_cache();
  CHECK(f.engine.totals().reserved_bytes == 0);
  CHECK(f.source.physical_bytes() == 0);
  CHECK(f.source.counters().unmaps == 4);
  CHECK(f.source.counters().destroys == 4);
}

TEST_CASE("physical page recycling maps wholly free pieces where a request lands", "[engine][recycle]") {
  Fixture f;
  // Fill 5 pieces with 20 MiB blocks, free the even ones: 3 wholly free pieces, 2 pinned.
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(f.alloc(20 * MiB));
  CHECK(f.source.counters().creates == 5);
  for (int i = 0; i < 5; i += 2) REQUIRE(f.engine.free(blocks[i]) == FreeStatus::ok);
  // A 60 MiB request fits nowhere mapped. The cheapest place is the free last piece plus two
  // slots after it; the two pieces come from the wholly free pieces 0 and 2.
  void* big = f.alloc(60 * MiB);
  CHECK(big == blocks[4]);
  CHECK(f.source.counters().creates == 5);  // nothing new created
  // The moved pieces keep their old mappings (recycle_keep_mappings, the default): no unmap.
  CHECK(f.source.counters().unmaps == 0);
  CHECK(f.source.counters().maps == 7);
  CHECK(f.engine.totals().kept_mappings == 2);
  CHECK(f.engine.totals().kept_mapping_bytes == 40 * MiB);
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
  CHECK(f.source.physical_bytes() == 100 * MiB);
  CHECK(f.source.mapped_bytes() == 140 * MiB);  // 100 MiB of pieces, 2 of them mapped twice
  REQUIRE(f.engine.free(big) == FreeStatus::ok);
  REQUIRE(f.engine.free(blocks[1]) == FreeStatus::ok);
  REQUIRE(f.engine.free(blocks[3]) == FreeStatus::ok);
  f.engine.check_invariants();
}

namespace {

// The kept-mapping scenario (recycle_keep_mappings): A (60 MiB, pieces P0 P1 P2 at slots 0-2) is
// freed behind a live block; X (80 MiB) moves P0, P1, P2 to slots 4-6 (kept mappings stay at 0-2)
// and creates one piece; X is freed and cut into four 20 MiB blocks, of which those on P0 (slot 4)
// and P1 (slot 6) are freed. Z (40 MiB) fits no free block: growth lands where A was, and with
// kept mappings P0 and P1 move back onto their own mappings there.
struct MoveBack {
  void* a = nullptr;
  void* z = nullptr;
  SimSourceCounters before_z, after_z;
};

MoveBack move_back(Fixture& f) {
  MoveBack m;
  m.a = f.alloc(60 * MiB);
  void* live = f.alloc(20 * MiB);
  (void)live;
  REQUIRE(f.engine.free(m.a) == FreeStatus::ok);
  void* x = f.alloc(80 * MiB);
  REQUIRE(f.engine.free(x) == FreeStatus::ok);
  std::vector<void*> quarters;
  for (int i = 0; i < 4; ++i) quarters.push_back(f.alloc(20 * MiB));
  REQUIRE(f.engine.free(quarters[0]) == FreeStatus::ok);
  REQUIRE(f.engine.free(quarters[2]) == FreeStatus::ok);
  m.before_z = f.source.counters();
  m.z = f.alloc(40 * MiB);
  m.after_z = f.source.counters();
  return m;
}

}  // namespace

TEST_CASE("kept mappings: a piece that moves back onto its old mapping makes no driver call",
          "[engine][recycle][kept_mappings]") {
  Fixture f;
  const MoveBack m = move_back(f);
  CHECK(m.z == m.a);
  CHECK(m.after_z.maps == m.before_z.maps);      // P0 and P1 were still mapped there
  CHECK(m.after_z.unmaps == m.before_z.unmaps);
  CHECK(m.after_z.creates == m.before_z.creates);
  CHECK(m.before_z.unmaps == 0);                 // X's moves kept their old mappings too
  // Kept: P2 where A was (slot 2), and P0, P1 where they were in X (slots 4 and 6).
  CHECK(f.engine.totals().kept_mappings == 3);
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
  CHECK(f.source.mapped_bytes() == 160 * MiB);
  f.engine.check_invariants();
  // empty_cache unmaps every kept mapping before it destroys pieces or frees address space.
  f.engine.empty_cache();
  CHECK(f.engine.totals().kept_mappings == 0);
  CHECK(f.engine.totals().kept_mapping_bytes == 0);
  CHECK(f.source.mapped_bytes() == f.source.physical_bytes());
  f.engine.check_invariants();
}

TEST_CASE("kept mappings off (recycle_keep_mappings:False): every move unmaps, nothing is kept",
          "[engine][recycle][kept_mappings]") {
  Config c = test_config();
  c.recycle_keep_mappings = false;
  Fixture f(c);
  const MoveBack m = move_back(f);
  CHECK(m.z == m.a);
  CHECK(m.after_z.maps == m.before_z.maps + 2);
  CHECK(m.after_z.unmaps == m.before_z.unmaps + 2);
  CHECK(m.before_z.unmaps == 3);
  CHECK(f.engine.totals().kept_mappings == 0);
  CHECK(f.source.mapped_bytes() == f.source.physical_bytes());
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);  // the same memory either way
}

TEST_CASE("kept mappings in the way of a new piece are unmapped first; the engine gives everything back",
          "[engine][recycle][kept_mappings]") {
  Fixture f;
  void* a = f.alloc(60 * MiB);  // P0 P1 P2 at slots 0-2
  void* live = f.alloc(20 * MiB);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  void* x = f.alloc(80 * MiB);  // P0 P1 P2 move to 4-6, kept at 0-2
  CHECK(f.engine.totals().kept_mappings == 3);
  // 60 MiB more, with nothing free: the cheapest place is where A was (no new address space
  // needed); its three kept mappings are unmapped before three new pieces are mapped there.
  const SimSourceCounters before = f.source.counters();
  void* y = f.alloc(60 * MiB);
  CHECK(y == a);
  CHECK(f.source.counters().unmaps == before.unmaps + 3);
  CHECK(f.source.counters().creates == before.creates + 3);
  CHECK(f.engine.totals().kept_mappings == 0);
  CHECK(f.source.mapped_bytes() == f.source.physical_bytes());
  for (void* p : {x, y, live}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.empty_cache();
  CHECK(f.source.physical_bytes() == 0);
  CHECK(f.source.mapped_bytes() == 0);
  f.engine.check_invariants();
}

TEST_CASE("kept mappings stay within the physical footprint", "[engine][recycle][kept_mappings]") {
  Fixture f;
  // Each round: X (60 MiB) fits no free block, so it grows from the free pieces of the round before
  // (moves, kept mappings) and new pieces; X is then cut into three blocks, the middle one kept
  // live. Kept mappings and the footprint grow by 20 MiB a round; the bound (kept <= reserved) is
  // checked after every round here and after every request in the random case below.
  std::vector<void*> pins;
  for (int round = 0; round < 10; ++round) {
    void* x = f.alloc(60 * MiB);
    REQUIRE(f.engine.free(x) == FreeStatus::ok);
    void* a = f.alloc(20 * MiB);
    pins.push_back(f.alloc(20 * MiB));
    void* c = f.alloc(20 * MiB);
    REQUIRE(f.engine.free(a) == FreeStatus::ok);
    REQUIRE(f.engine.free(c) == FreeStatus::ok);
    const EngineTotals t = f.engine.totals();
    INFO("round " << round);
    CHECK(t.kept_mapping_bytes <= t.reserved_bytes);
    CHECK(f.source.mapped_bytes() == f.source.physical_bytes() + t.kept_mapping_bytes);
  }
  CHECK(f.engine.totals().kept_mappings == 9);
  CHECK(f.source.counters().unmaps == 0);
  for (void* p : pins) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.empty_cache();
  CHECK(f.source.physical_bytes() == 0);
  CHECK(f.source.mapped_bytes() == 0);
}

TEST_CASE("kept mappings: random requests keep every invariant and give everything back",
          "[engine][recycle][kept_mappings]") {
  // Not asserted: fewer calls. A kept mapping's unmap is only deferred (empty_cache here pays it
  // every 150 requests), and the two runs' layouts part ways; the corpus replay measures it.
  for (const PieceSizing pieces : {PieceSizing::fixed, PieceSizing::adaptive}) {
    for (const bool keep : {false, true}) {
      INFO("pieces " << (pieces == PieceSizing::fixed ? "fixed" : "adaptive") << ", keep " << keep);
      Config c = test_config();
      c.pieces = pieces;
      c.recycle_keep_mappings = keep;
      Fixture f(c);
      std::mt19937_64 rng(20261202);
      std::vector<void*> live;
      for (int i = 0; i < 600; ++i) {
        if (live.size() > 12 || (!live.empty() && rng() % 3 == 0)) {
          const std::size_t k = rng() % live.size();
          REQUIRE(f.engine.free(live[k]) == FreeStatus::ok);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        } else {
          live.push_back(f.alloc((1 + rng() % 40) * MiB + 512 * (rng() % 7)));
        }
        if (i % 150 == 149) f.engine.empty_cache();
        CHECK(f.source.physical_bytes() == f.engine.totals().reserved_bytes);
        CHECK(f.source.mapped_bytes() == f.source.physical_bytes() + f.engine.totals().kept_mapping_bytes);
        CHECK(f.engine.totals().kept_mapping_bytes <= f.engine.totals().reserved_bytes);
      }
      for (void* p : live) REQUIRE(f.engine.free(p) == FreeStatus::ok);
      f.engine.empty_cache();
      CHECK(f.source.physical_bytes() == 0);
      CHECK(f.source.mapped_bytes() == 0);
    }
  }
}

TEST_CASE("without recycling expandable growth creates new pieces", "[engine][recycle]") {
  Config c = test_config();
  c.recycle = false;
  Fixture f(c);
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(f.alloc(20 * MiB));
  for (int i = 0; i < 5; i += 2) REQUIRE(f.engine.free(blocks[i]) == FreeStatus::ok);
  f.alloc(60 * MiB);
  CHECK(f.source.counters().creates == 7);
  CHECK(f.source.counters().unmaps == 0);
  CHECK(f.engine.totals().reserved_bytes == 140 * MiB);
}

TEST_CASE("adaptive pieces follow the request: at most 8 MiB inside, one slot at a shared end",
          "[engine][recycle][pieces]") {
  Config c = test_config();
  c.pieces = PieceSizing::adaptive;
  Fixture f(c);
  void* a = f.alloc(50 * MiB);  // 25 slots, no shared end: 7 pieces of 4, 4, 4, 4, 3, 3, 3 slots
  CHECK(f.source.counters().creates == 7);
  CHECK(f.engine.totals().reserved_bytes == 50 * MiB);
  void* b = f.alloc(3 * MiB + 512);  // right after a: one inside slot, and its last slot shared
  CHECK(reinterpret_cast<std::uintptr_t>(b) == reinterpret_cast<std::uintptr_t>(a) + 50 * MiB);
  CHECK(f.source.counters().creates == 9);
  CHECK(f.engine.totals().reserved_bytes == 54 * MiB);
  for (void* p : {a, b}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.check_invariants();
  f.engine.empty_cache();
  CHECK(f.source.physical_bytes() == 0);
  CHECK(f.source.counters().destroys == 9);
}

TEST_CASE("adaptive pieces freed with their request move where the next request lands", "[engine][recycle][pieces]") {
  Config c = test_config();
  c.pieces = PieceSizing::adaptive;
  Fixture f(c);
  std::vector<void*> blocks;
  for (int i = 0; i < 5; ++i) blocks.push_back(f.alloc(8 * MiB));  // one 8 MiB piece each
  CHECK(f.source.counters().creates == 5);
  for (int i = 0; i < 5; i += 2) REQUIRE(f.engine.free(blocks[i]) == FreeStatus::ok);
  // 24 MiB fits no free block: it lands on the last (free) block and needs 8 MiB more, which the
  // pieces of blocks 0 and 2 provide.
  void* big = f.alloc(24 * MiB);
  CHECK(big == blocks[4]);
  CHECK(f.source.counters().creates == 5);
  CHECK(f.source.counters().unmaps == 0);  // their old mappings are kept
  CHECK(f.engine.totals().kept_mappings == 2);
  CHECK(f.engine.totals().reserved_bytes == 40 * MiB);
  CHECK(f.source.physical_bytes() == 40 * MiB);
  for (void* p : {big, blocks[1], blocks[3]}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.check_invariants();
}

TEST_CASE("recycle_overhang: a longer free piece covers a growth's rest and reaches into the hole",
          "[engine][recycle][pieces][overhang]") {
  for (const bool overhang : {false, true}) {
    DYNAMIC_SECTION("recycle_overhang:" << (overhang ? "True" : "False")) {
      Config c = test_config();
      c.pieces = PieceSizing::adaptive;
      c.recycle_overhang = overhang;
      Fixture f(c);
      std::vector<void*> blocks;
      for (int i = 0; i < 5; ++i) blocks.push_back(f.alloc(8 * MiB));  // one 8 MiB piece each, slots 0-19
      REQUIRE(f.engine.free(blocks[0]) == FreeStatus::ok);  // blocks 0 and 2: wholly free pieces
      REQUIRE(f.engine.free(blocks[2]) == FreeStatus::ok);
      // 12 MiB fits no free block: it lands at the region's end (slots 20-25). One free piece
      // fills slots 20-23; no free piece fits the 2 slots left.
      void* big = f.alloc(12 * MiB);
      CHECK(reinterpret_cast<std::uintptr_t>(big) == reinterpret_cast<std::uintptr_t>(blocks[4]) + 8 * MiB);
      if (overhang) {
        // The other free piece covers them and 2 slots past the request: nothing is created.
        CHECK(f.source.counters().creates == 5);
        CHECK(f.engine.totals().reserved_bytes == 40 * MiB);
        // The 4 MiB past the request are free mapped memory: the next 4 MiB request lands there
        // without a driver call.
        const std::size_t maps = f.source.counters().maps;
        void* after = f.alloc(4 * MiB);
        CHECK(reinterpret_cast<std::uintptr_t>(after) == reinterpret_cast<std::uintptr_t>(big) + 12 * MiB);
        CHECK(f.source.counters().maps == maps);
        REQUIRE(f.engine.free(after) == FreeStatus::ok);
      } else {
        // The 2 slots are created.
        CHECK(f.source.counters().creates == 6);
        CHECK(f.engine.totals().reserved_bytes == 44 * MiB);
      }
      CHECK(f.engine.totals().kept_mappings == (overhang ? 2u : 1u));  // the pieces that moved
      for (void* p : {big, blocks[1], blocks[3], blocks[4]}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
      f.engine.check_invariants();
      f.engine.empty_cache();
      CHECK(f.source.physical_bytes() == 0);
    }
  }
}

TEST_CASE("recycle_headroom: growth creates instead of recycling while the footprint stays within it",
          "[engine][recycle][headroom]") {
  // 40 MiB in use at most (five 8 MiB blocks), two of them freed: 24 MiB in use, 40 reserved. A
  // 12 MiB request needs 12 MiB mapped at the region's end: creating all of it makes the footprint
  // 52 MiB = 1.3 x the 40 MiB ever in use.
  for (const double headroom : {0.0, 0.2, 0.5}) {
    DYNAMIC_SECTION("recycle_headroom:" << headroom) {
      Config c = test_config();
      c.pieces = PieceSizing::adaptive;
      c.recycle_headroom = headroom;
      // The rule applies to growths the recycle budget lets recycle; without a budget (and without
      // overhang) this growth's only alternatives are the two below.
      c.recycle_budget = 1.0;
      c.recycle_overhang = false;
      Fixture f(c);
      std::vector<void*> blocks;
      for (int i = 0; i < 5; ++i) blocks.push_back(f.alloc(8 * MiB));
      REQUIRE(f.engine.free(blocks[0]) == FreeStatus::ok);
      REQUIRE(f.engine.free(blocks[2]) == FreeStatus::ok);
      void* big = f.alloc(12 * MiB);
      if (headroom == 0.5) {  // 52 <= 1.5 x 40: created, nothing moves
        CHECK(f.engine.totals().reserved_bytes == 52 * MiB);
        CHECK(f.engine.totals().kept_mappings == 0);
      } else {  // off, or 52 > 1.2 x 40: a free piece moves first (8 MiB), 4 MiB is created
        CHECK(f.engine.totals().reserved_bytes == 44 * MiB);
        CHECK(f.engine.totals().kept_mappings == 1);
      }
      for (void* p : {big, blocks[1], blocks[3], blocks[4]}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
      f.engine.check_invariants();
    }
  }
}

TEST_CASE("a fragmenting workload keeps reserved close to allocated with recycling", "[engine][recycle]") {
  Config config = test_config();
  config.pieces = PieceSizing::adaptive;  // the default's recycling
  config.thread_cache = std::getenv("TC") != nullptr;
  Fixture f(config);
  std::mt19937_64 rng(42);
  std::vector<std::pair<void*, std::size_t>> live;
  std::size_t live_bytes = 0, peak_live = 0;
  for (int step = 0; step < 4000; ++step) {
    if (live.empty() || rng() % 100 < 52) {
      // Large short-lived and small long-lived tensors interleaved.
      std::size_t n = (rng() % 4 == 0) ? (1 + rng() % 8) * 512 * KiB : (21 + rng() % 80) * MiB;
      auto r = f.engine.allocate(n, 0);
      REQUIRE(r.ok());
      live.emplace_back(r.ptr, r.size_bytes);
      live_bytes += r.size_bytes;
      peak_live = std::max(peak_live, live_bytes);
    } else {
      std::size_t i = rng() % live.size();
      REQUIRE(f.engine.free(live[i].first) == FreeStatus::ok);
      live_bytes -= live[i].second;
      live[i] = live.back();
      live.pop_back();
    }
    if (live_bytes > 1500 * MiB) {  // bound the working set
      while (live_bytes > 800 * MiB) {
        REQUIRE(f.engine.free(live.back().first) == FreeStatus::ok);
        live_bytes -= live.back().second;
        live.pop_back();
      }
    }
  }
  const double ratio = static_cast<double>(f.source.physical_bytes()) / static_cast<double>(peak_live);
  INFO("peak live " << peak_live << " physical " << f.source.physical_bytes());
  // Physical memory never exceeds the peak of live bytes by more than the pieces partly used.
  CHECK(ratio < 1.10);
  for (auto& [p, n] : live) REQUIRE(f.engine.free(p) == FreeStatus::ok);
}

namespace {

// SimSource with a clock: every map and unmap takes call_ns of simulated time; advance() moves the
// clock on (time spent computing). The recycle budget reads it through now_ns().
class ClockedSource final : public ForwardingSource {
 public:
  // The base only binds inner, built after it.
  ClockedSource() : ForwardingSource(inner) {}
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override {
    now += call_ns;
    return inner.map(va, size_bytes, handle);
  }
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override {
    now += call_ns;
    return inner.unmap(va, size_bytes);
  }
  std::int64_t now_ns() const override { return now; }

  void advance(std::int64_t ns) { now += ns; }
  SimSource inner;
  std::int64_t now = 0;
  std::int64_t call_ns = 1'000'000;  // 1 ms a call
};

struct ClockedFixture {
  explicit ClockedFixture(const Config& c) : events(make_immediate_events()), engine(source, *events, c) {}
  ClockedSource source;
  std::unique_ptr<StreamEvents> events;
  CachingAllocator engine;

  void* alloc(std::size_t n) {
    auto r = engine.allocate(n, 0);
    REQUIRE(r.ok());
    return r.ptr;
  }
  // 5 pieces of 20 MiB, the even ones freed, then 60 MiB: it lands on the last piece and needs two
  // more pieces, which recycling takes from pieces 0 and 2 (see the case above) or growth creates.
  void fragment_and_grow() {
    std::vector<void*> blocks;
    for (int i = 0; i < 5; ++i) blocks.push_back(alloc(20 * MiB));
    for (int i = 0; i < 5; i += 2) REQUIRE(engine.free(blocks[i]) == FreeStatus::ok);
    void* big = alloc(60 * MiB);
    for (void* p : {big, blocks[1], blocks[3]}) REQUIRE(engine.free(p) == FreeStatus::ok);
  }
};

Config budget_config(double slack) {
  Config c = test_config();
  c.recycle_keep_mappings = false;  // recycling unmaps what it moves: the counts below count moves
  c.recycle_budget = 0.01;  // 1% of elapsed time
  c.recycle_burst_ms = 1;
  c.recycle_slack = slack;
  c.recycle_ceiling = 0.0;  // the slack bound alone (the ceiling has its own case)
  return c;
}

}  // namespace

TEST_CASE("the recycle budget: past it, growth creates instead of moving pieces; time refills it",
          "[engine][recycle][recycle_budget]") {
  ClockedFixture f(budget_config(/*slack=*/1.0));
  // The burst (1 ms) allows the first recycling: 2 unmaps + 2 maps at 1 ms each, 3 ms into debt.
  f.fragment_and_grow();
  CHECK(f.source.inner.counters().unmaps == 2);
  CHECK(f.source.inner.counters().creates == 5);
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
  f.engine.check_invariants();
  // The same again at once: the budget is spent, so growth creates (more memory, no unmap).
  f.engine.empty_cache();
  const auto creates = f.source.inner.counters().creates;
  f.fragment_and_grow();
  CHECK(f.source.inner.counters().unmaps == 2 + 5);  // empty_cache unmapped the 5 pieces it held
  CHECK(f.source.inner.counters().creates == creates + 7);
  CHECK(f.engine.totals().reserved_bytes == 140 * MiB);
  f.engine.check_invariants();
  // After 1,000 s the bucket is full again (at most the 1 ms burst): recycling resumes.
  f.engine.empty_cache();
  f.source.advance(std::int64_t{1000} * 1'000'000'000);
  const auto unmaps = f.source.inner.counters().unmaps;
  f.fragment_and_grow();
  CHECK(f.source.inner.counters().unmaps == unmaps + 2);
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
  f.engine.check_invariants();
}

TEST_CASE("the recycle budget's memory guard: past the slack, recycling goes on whatever it costs",
          "[engine][recycle][recycle_budget]") {
  ClockedFixture f(budget_config(/*slack=*/0.0));
  f.fragment_and_grow();
  f.engine.empty_cache();
  const auto before = f.source.inner.counters();
  f.fragment_and_grow();  // over the budget, but creating would add memory: it recycles
  CHECK(f.source.inner.counters().unmaps == before.unmaps + 2);
  CHECK(f.source.inner.counters().creates == before.creates + 5);
  CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
  f.engine.check_invariants();
}

TEST_CASE("the memory guard's ceiling: growth past the budget buys only while the footprint stays near the most in use",
          "[engine][recycle][recycle_budget]") {
  // Round 1 (the burst) recycles: 100 MiB reserved, at most 100 MiB ever in use. Round 2, the
  // budget spent: creating the 60 MiB request's two missing pieces instead of moving two free ones
  // would take the footprint to 140 MiB. The slack (1.0) allows it; the ceiling decides.
  for (const double ceiling : {0.0, 0.5, 0.3}) {
    DYNAMIC_SECTION("recycle_ceiling:" << ceiling) {
      Config c = budget_config(/*slack=*/1.0);
      c.recycle_ceiling = ceiling;
      ClockedFixture f(c);
      f.fragment_and_grow();
      CHECK(f.source.inner.counters().unmaps == 2);
      CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
      f.engine.empty_cache();
      const auto before = f.source.inner.counters();
      f.fragment_and_grow();
      const bool buys = ceiling == 0.0 || 140.0 <= (1.0 + ceiling) * 100.0;
      if (buys) {
        CHECK(f.source.inner.counters().unmaps == before.unmaps);
        CHECK(f.source.inner.counters().creates == before.creates + 7);
        CHECK(f.engine.totals().reserved_bytes == 140 * MiB);
      } else {
        CHECK(f.source.inner.counters().unmaps == before.unmaps + 2);
        CHECK(f.source.inner.counters().creates == before.creates + 5);
        CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
      }
      f.engine.check_invariants();
    }
  }
}

TEST_CASE("recycle_churn: while moves take a large share of the recent time, the memory guard may buy more",
          "[engine][recycle][recycle_budget][churn]") {
  // The default budget (none: the guard decides every growth that could move pieces). A 1 GiB block
  // stays; round 1 builds the rest and recycles (two 1 ms unmaps and maps: 4 ms of moves). Round 2,
  // from an emptied cache, can either move two free pieces again or create 40 MiB: about 3.5% of the
  // footprint, past the guard's slack (0.008) and ceiling (0.015), within them plus the allowance.
  for (const bool churn : {false, true})
    for (const bool idle : {false, true})
      DYNAMIC_SECTION("recycle_churn " << churn << ", idle for 10 s " << idle) {
        Config c = test_config();
        c.recycle_keep_mappings = false;  // a move unmaps: the counts below count moves
        c.recycle_churn = churn ? 0.02 : 0.0;
        ClockedFixture f(c);
        void* kept = f.alloc(1024 * MiB);
        const std::size_t base = f.engine.totals().reserved_bytes;  // the block's pieces (1,040 MiB)
        f.fragment_and_grow();
        CHECK(f.source.inner.counters().unmaps == 2);
        f.engine.empty_cache();
        if (idle) f.source.advance(std::int64_t{10} * 1'000'000'000);  // the moves long forgotten
        const auto before = f.source.inner.counters();
        f.fragment_and_grow();
        // The allowance opened once (round 2's refusal), or never; memory_stats reads the count.
        CHECK(f.engine.churn_openings() == (churn && !idle ? 1U : 0U));
        if (churn && !idle) {
          CHECK(f.source.inner.counters().unmaps == before.unmaps);
          CHECK(f.source.inner.counters().creates == before.creates + 7);
          CHECK(f.engine.totals().reserved_bytes == base + 140 * MiB);
        } else {
          CHECK(f.source.inner.counters().unmaps == before.unmaps + 2);
          CHECK(f.source.inner.counters().creates == before.creates + 5);
          CHECK(f.engine.totals().reserved_bytes == base + 100 * MiB);
        }
        f.engine.check_invariants();
        REQUIRE(f.engine.free(kept) == FreeStatus::ok);
      }
}

TEST_CASE("frontier_piece_size_mb: a growth at a region's end that moves nothing creates longer pieces",
          "[engine][pieces][frontier]") {
  // 64 MiB in an empty engine: the inside of the request in pieces of at most 8 MiB (8 creates), or
  // at most 32 MiB at the frontier (2 creates). Freed and requested again as 16 MiB pieces, the
  // 32 MiB pieces serve from the cache as before: the footprint is the same either way.
  for (const std::size_t frontier_mib : {0, 32}) {
    DYNAMIC_SECTION("frontier_piece_size_mb:" << frontier_mib) {
      Config c = test_config();
      c.pieces = PieceSizing::adaptive;
      c.max_piece_bytes = 8 * MiB;
      c.frontier_piece_bytes = frontier_mib * MiB;
      ClockedFixture f(c);
      void* p = f.alloc(64 * MiB);
      CHECK(f.source.inner.counters().creates == (frontier_mib ? 2u : 8u));
      CHECK(f.engine.totals().reserved_bytes == 64 * MiB);
      REQUIRE(f.engine.free(p) == FreeStatus::ok);
      std::vector<void*> quarters;
      for (int i = 0; i < 4; ++i) quarters.push_back(f.alloc(16 * MiB));
      CHECK(f.engine.totals().reserved_bytes == 64 * MiB);
      f.engine.check_invariants();
      for (void* q : quarters) REQUIRE(f.engine.free(q) == FreeStatus::ok);
    }
  }
}

namespace {

// Three 32 MiB requests in an empty engine under c, each growing the region at its end; after each,
// the source's cumulative creates must be creates[k]. Reserved ends at 96 MiB; everything is freed.
void check_three_growths(const Config& c, const std::array<unsigned, 3>& creates) {
  ClockedFixture f(c);
  std::vector<void*> held;
  for (unsigned k = 0; k < 3; ++k) {
    held.push_back(f.alloc(32 * MiB));
    CHECK(f.source.inner.counters().creates == creates[k]);
  }
  CHECK(f.engine.totals().reserved_bytes == 96 * MiB);
  f.engine.check_invariants();
  for (void* p : held) REQUIRE(f.engine.free(p) == FreeStatus::ok);
}

}  // namespace

TEST_CASE("short_pieces_below_mb: one-slot pieces while the footprint is below the bound",
          "[engine][pieces][short_pieces]") {
  // Three 32 MiB requests in an empty engine, each at the region's end. Off: the inside of each in
  // pieces of at most 8 MiB (4 creates each). With a 48 MiB bound: the first two growths start
  // below it (0 and 32 MiB reserved), so their pieces are one 2 MiB slot (16 creates each); the
  // third starts at 64 MiB and uses 8 MiB pieces again, frontier_piece_size_mb included.
  for (const std::size_t below_mib : {0, 48}) {
    DYNAMIC_SECTION("short_pieces_below_mb:" << below_mib) {
      Config c = test_config();
      c.pieces = PieceSizing::adaptive;
      c.max_piece_bytes = 8 * MiB;
      c.frontier_piece_bytes = 16 * MiB;
      c.short_pieces_below_bytes = below_mib * MiB;
      check_three_growths(c, below_mib ? std::array<unsigned, 3>{16, 32, 34} : std::array<unsigned, 3>{2, 4, 6});
    }
  }
}

TEST_CASE("footprint_pieces: pieces grow with the footprint", "[engine][pieces][footprint_pieces]") {
  // Three 32 MiB requests in an empty engine, each at the region's end, no end shared. Off: the
  // inside of each in pieces of at most 8 MiB (4 creates each). With footprint_pieces:8 the
  // longest piece is the footprint / 8 when the growth starts: one slot at 0 reserved (16 creates),
  // 4 MiB at 32 MiB (8 creates), 8 MiB at 64 MiB (4 creates: max_piece_size_mb bounds it again).
  // The default (512) gives one-slot pieces at these footprints, and max_piece_size_mb's from 4 GiB.
  CHECK(Config{}.footprint_pieces == 512);
  for (const std::size_t n : {0, 8}) {
    DYNAMIC_SECTION("footprint_pieces:" << n) {
      Config c = test_config();
      c.pieces = PieceSizing::adaptive;
      c.max_piece_bytes = 8 * MiB;
      c.footprint_pieces = n;
      check_three_growths(c, n ? std::array<unsigned, 3>{16, 24, 28} : std::array<unsigned, 3>{4, 8, 12});
    }
  }
}

TEST_CASE("recycle_budget:0 gives recycling no driver time: the memory guard decides every growth",
          "[engine][recycle][recycle_budget]") {
  // No burst, no refill: the very first growth that could recycle goes to the guard. With slack 0
  // it may buy nothing, so it recycles (as without a budget); with slack 1 it creates.
  for (const double slack : {0.0, 1.0}) {
    DYNAMIC_SECTION("recycle_slack:" << slack) {
      Config c = budget_config(slack);
      c.recycle_budget = 0.0;
      c.recycle_burst_ms = 0;
      ClockedFixture f(c);
      f.fragment_and_grow();
      CHECK(f.source.inner.counters().unmaps == (slack == 0.0 ? 2u : 0u));
      CHECK(f.engine.totals().reserved_bytes == (slack == 0.0 ? 100 : 140) * MiB);
      f.engine.check_invariants();
    }
  }
}

TEST_CASE("the memory guard counts as bought only the footprint beyond the most ever in use",
          "[engine][recycle][recycle_budget]") {
  // 20 MiB pieces (test_config), slots S0.. of one region. Recycling alone would reserve 140, 140,
  // 160 and 180 MiB after steps c, e, f and g below (f needing a growth there); the budget, spent
  // by the recycling at c, buys 20 MiB at e and 20 MiB at g. At g the count of what it created
  // beyond its recycling plans is 20 MiB, but y (f) has used that memory since, and g's request
  // takes the most memory in use to 180 MiB, above what is reserved (160): nothing bought is still
  // beyond it, so the slack (0.2 x 160) allows g's 20 MiB. The raw count alone would have refused
  // it (20 + 20 > 0.2 x (160 - 20)).
  ClockedFixture f(budget_config(/*slack=*/0.2));
  std::vector<void*> p;
  for (int i = 0; i < 7; ++i) p.push_back(f.alloc(20 * MiB));  // a: S0..S6
  for (int i : {0, 2, 6}) REQUIRE(f.engine.free(p[i]) == FreeStatus::ok);
  void* q = f.alloc(60 * MiB);  // c: S6..S8, the pieces of S0 and S2 move (the burst's recycling)
  CHECK(f.source.inner.counters().unmaps == 2);
  CHECK(f.engine.totals().reserved_bytes == 140 * MiB);
  for (int i : {1, 3}) REQUIRE(f.engine.free(p[i]) == FreeStatus::ok);
  void* x = f.alloc(40 * MiB);  // e: S0..S1; the budget is spent: S0 is created, S3's piece stays
  CHECK(f.source.inner.counters().unmaps == 2);
  CHECK(f.engine.totals().reserved_bytes == 160 * MiB);
  void* y = f.alloc(20 * MiB);  // f: S3, from the cache
  CHECK(f.engine.totals().reserved_bytes == 160 * MiB);
  REQUIRE(f.engine.free(p[4]) == FreeStatus::ok);
  void* w = f.alloc(40 * MiB);  // g: S9..S10, both created; S4's piece stays
  CHECK(f.source.inner.counters().unmaps == 2);
  CHECK(f.engine.totals().reserved_bytes == 200 * MiB);
  f.engine.check_invariants();
  for (void* b : {q, x, y, w, p[5]}) REQUIRE(f.engine.free(b) == FreeStatus::ok);
}

TEST_CASE("without a recycle budget (recycle_budget:1) recycling never waits for time",
          "[engine][recycle][recycle_budget]") {
  Config c = test_config();
  c.recycle_budget = 1.0;
  c.recycle_keep_mappings = false;
  ClockedFixture f(c);
  for (int round = 0; round < 3; ++round) {
    const auto before = f.source.inner.counters();
    f.fragment_and_grow();
    CHECK(f.source.inner.counters().unmaps == before.unmaps + 2);
    CHECK(f.engine.totals().reserved_bytes == 100 * MiB);
    f.engine.empty_cache();
  }
}

TEST_CASE("classic segments follow PyTorch's sizes and split rules", "[engine][classic]") {
  Fixture f(test_config(false));
  auto a = f.engine.allocate(400, 0);  // small pool: a 2 MiB segment
  REQUIRE(a.ok());
  CHECK(a.size_bytes == 512);
  auto c = f.engine.allocate(12 * MiB + 1, 0);  // > 10 MiB: rounded up to 2 MiB -> 14 MiB
  REQUIRE(c.ok());
  auto b = f.engine.allocate(3 * MiB, 0);  // 1-10 MiB: a 20 MiB segment (c's rest is too small)
  REQUIRE(b.ok());
  auto snap = f.engine.snapshot();
  std::vector<std::size_t> sizes;
  for (const auto& s : snap.segments) sizes.push_back(s.size_bytes);
  std::sort(sizes.begin(), sizes.end());
  CHECK(sizes == std::vector<std::size_t>{2 * MiB, 14 * MiB, 20 * MiB});
  // The 14 MiB segment's remainder (2 MiB - 512) is > 1 MiB, so it was split off.
  CHECK(c.size_bytes == 12 * MiB + 512);
  // A remainder of <= 1 MiB in the large pool is not split off.
  auto d = f.engine.allocate(19 * MiB + 512 * KiB, 0);  // new 20 MiB segment, 512 KiB left
  REQUIRE(d.ok());
  CHECK(d.size_bytes == 20 * MiB);
  for (void* p : {a.ptr, b.ptr, c.ptr, d.ptr}) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  f.engine.empty_cache();
  CHECK(f.engine.totals().reserved_bytes == 0);
  CHECK(f.engine.totals().segments == 0);
}

TEST_CASE("classic max_split_size keeps oversize blocks whole", "[engine][classic]") {
  Config c = test_config(false);
  c.max_split_size_bytes = 40 * MiB;
  Fixture f(c);
  auto big = f.engine.allocate(100 * MiB, 0);
  REQUIRE(big.ok());
  REQUIRE(f.engine.free(big.ptr) == FreeStatus::ok);
  // A small request must not be cut from the oversize cached block.
  auto small = f.engine.allocate(30 * MiB, 0);
  REQUIRE(small.ok());
  CHECK(small.ptr != big.ptr);
  // A 90 MiB request may use the 100 MiB block (waste < max_non_split_rounding = 20 MiB), unsplit.
  auto again = f.engine.allocate(90 * MiB, 0);
  REQUIRE(again.ok());
  CHECK(again.ptr == big.ptr);
  CHECK(again.size_bytes == 100 * MiB);
}

TEST_CASE("record_stream defers reuse until the other stream's work completes", "[engine][streams]") {
  SimSource source;
  ManualStreamEvents events;
  Config config = test_config();
  config.thread_cache = false;  // b would otherwise come straight back from the thread's cache
  CachingAllocator engine(source, events, config);
  auto a = engine.allocate(256 * KiB, 1);
  REQUIRE(a.ok());
  REQUIRE(engine.record_stream(a.ptr, 2) == FreeStatus::ok);
  REQUIRE(engine.record_stream(a.ptr, 1) == FreeStatus::ok);  // own stream: ignored
  REQUIRE(engine.free(a.ptr) == FreeStatus::ok);
  CHECK(events.outstanding() == 1);
  CHECK(engine.totals().active_bytes == 256 * KiB);
  CHECK(engine.free(a.ptr) == FreeStatus::double_free);
  auto b = engine.allocate(256 * KiB, 1);
  REQUIRE(b.ok());
  CHECK(b.ptr != a.ptr);  // still pending
  events.complete_stream(2);
  REQUIRE(engine.free(b.ptr) == FreeStatus::ok);
  auto c = engine.allocate(256 * KiB, 1);  // processes the completed marker first
  REQUIRE(c.ok());
  CHECK(c.ptr == a.ptr);
  CHECK(events.outstanding() == 0);
  REQUIRE(engine.free(c.ptr) == FreeStatus::ok);
}

TEST_CASE("misuse gets one clear status and changes nothing", "[engine][misuse]") {
  Fixture f;
  void* a = f.alloc(8 * KiB);
  void* b = f.alloc(8 * KiB);
  const auto before = f.engine.totals();
  CHECK(f.engine.free(static_cast<char*>(a) + 512) == FreeStatus::interior_pointer);
  int local = 0;
  CHECK(f.engine.free(&local) == FreeStatus::foreign_pointer);
  CHECK(f.engine.free(nullptr) == FreeStatus::null_pointer);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  CHECK(f.engine.free(a) == FreeStatus::double_free);
  CHECK(f.engine.record_stream(a, 3) == FreeStatus::double_free);  // a use after free
  CHECK(f.engine.totals().allocated_bytes == before.allocated_bytes - 8 * KiB);
  CHECK(std::string(describe(FreeStatus::double_free)).find("double free") != std::string::npos);
  REQUIRE(f.engine.free(b) == FreeStatus::ok);
  f.engine.check_invariants();
}

TEST_CASE("out of memory is a value with the facts, and frees recover", "[engine][oom]") {
  SimSourceOptions o;
  o.capacity_bytes = 200 * MiB;
  Fixture f(test_config(), o);
  void* a = f.alloc(100 * MiB);
  void* b = f.alloc(60 * MiB);
  auto r = f.engine.allocate(100 * MiB, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.ptr == nullptr);
  const OomInfo& oom = *r.oom;
  CHECK(oom.requested_bytes == 100 * MiB);
  CHECK(oom.rounded_bytes == 100 * MiB);
  CHECK(oom.allocated_bytes == 160 * MiB);
  CHECK(oom.reserved_bytes == 160 * MiB);
  CHECK(oom.cause == SourceStatus::out_of_memory);
  CHECK_FALSE(oom.cap_reached);
  CHECK(describe(oom).find("out of memory") != std::string::npos);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  auto again = f.engine.allocate(100 * MiB, 0);
  REQUIRE(again.ok());
  REQUIRE(f.engine.free(again.ptr) == FreeStatus::ok);
  REQUIRE(f.engine.free(b) == FreeStatus::ok);
}

TEST_CASE("the reason a request failed reaches its OomInfo on every failing path", "[engine][oom]") {
  // allocate() makes its failure record only on the paths that can fail (a request too large to
  // try, the slow path): each of them still reports its own cause and detail.
  SimSourceOptions o;
  o.capacity_bytes = 200 * MiB;
  Fixture f(test_config(), o);
  auto huge = f.engine.allocate(std::size_t{1} << 60, 0);
  REQUIRE_FALSE(huge.ok());
  CHECK(huge.oom->cause == SourceStatus::out_of_memory);
  CHECK(huge.oom->detail == "requests of 1 EiB or more are refused");
  CHECK_FALSE(huge.oom->cap_reached);
  void* a = f.alloc(150 * MiB);
  auto over = f.engine.allocate(100 * MiB, 0);  // the provider has 50 MiB left
  REQUIRE_FALSE(over.ok());
  CHECK(over.oom->cause == SourceStatus::out_of_memory);
  CHECK(over.oom->detail.find("1 EiB") == std::string::npos);  // nothing left over from the request before
  f.engine.set_memory_limit(160 * MiB);
  auto capped = f.engine.allocate(20 * MiB, 0);
  REQUIRE_FALSE(capped.ok());
  CHECK(capped.oom->cap_reached);
  CHECK(capped.oom->detail.empty());
  f.engine.set_memory_limit(0);
  auto fits = f.engine.allocate(20 * MiB, 0);  // a success after failures
  REQUIRE(fits.ok());
  CHECK_FALSE(fits.oom);
  REQUIRE(f.engine.free(fits.ptr) == FreeStatus::ok);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
}

TEST_CASE("the memory cap refuses growth and reports it", "[engine][oom]") {
  Fixture f;
  f.engine.set_memory_limit(100 * MiB);
  void* a = f.alloc(60 * MiB);
  auto r = f.engine.allocate(60 * MiB, 0);
  REQUIRE_FALSE(r.ok());
  CHECK(r.oom->cap_reached);
  CHECK(r.oom->cap_bytes == 100 * MiB);
  CHECK(f.source.physical_bytes() == 60 * MiB);
  f.engine.set_memory_limit(0);
  f.engine.set_memory_fraction(0.5);  // SimSource default capacity 80 GiB
  CHECK(f.engine.totals().cap_bytes == 40ull * 1024 * MiB);
  auto ok = f.engine.allocate(60 * MiB, 0);
  CHECK(ok.ok());
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
}

TEST_CASE("a provider that cannot tell its total gets no fraction cap and full-size regions", "[engine][oom]") {
  // One cap rule (cap_policy.h): a total of 0 means "unknown", and the fraction is then not applied.
  SimSource sim;
  test::SlowSource unknown(sim, std::chrono::microseconds(0));
  unknown.report_unknown_total(true);
  auto events = make_immediate_events();
  Config c = test_config();
  c.per_process_memory_fraction = 0.5;
  c.va_reserve_bytes = 0;  // the region size comes from the provider's total, here unknown
  CachingAllocator engine(unknown, *events, c);
  CHECK(engine.totals().cap_bytes == kNoLimit);
  auto small = engine.allocate(MiB, 0);
  REQUIRE(small.ok());
  auto big = engine.allocate(300 * MiB, 0);  // 15 pieces in one region
  REQUIRE(big.ok());
  CHECK(engine.totals().segments == 2);  // one region per pool
  engine.set_memory_limit(400 * MiB);  // an absolute limit still caps
  CHECK(engine.totals().cap_bytes == 400 * MiB);
  auto over = engine.allocate(200 * MiB, 0);
  REQUIRE_FALSE(over.ok());
  CHECK(over.oom->cap_reached);
  REQUIRE(engine.free(big.ptr) == FreeStatus::ok);
  REQUIRE(engine.free(small.ptr) == FreeStatus::ok);
}

TEST_CASE("the OOM retry frees cached memory of the other pool", "[engine][oom]") {
  SimSourceOptions o;
  o.capacity_bytes = 40 * MiB;
  Fixture f(test_config(), o);
  std::vector<void*> smalls;
  for (int i = 0; i < 10; ++i) smalls.push_back(f.alloc(MiB));  // 5 small pieces = 10 MiB
  for (void* p : smalls) REQUIRE(f.engine.free(p) == FreeStatus::ok);
  CHECK(f.source.physical_bytes() == 10 * MiB);
  // 40 MiB of large pieces need the small pool's cached pieces back.
  void* big = f.alloc(40 * MiB);
  CHECK(f.source.physical_bytes() == 40 * MiB);
  REQUIRE(f.engine.free(big) == FreeStatus::ok);
}

TEST_CASE("source faults surface as failures and leave the engine consistent", "[engine][faults]") {
  Fixture f;
  f.source.fail_nth(SimSource::Op::create, 2);
  auto r = f.engine.allocate(50 * MiB, 0);  // needs 3 pieces; the second create fails, and again
  if (!r.ok()) CHECK(r.oom->cause == SourceStatus::fault_injected);
  f.engine.check_invariants();
  f.source.fail_nth(SimSource::Op::map, 1);
  auto s = f.engine.allocate(300 * MiB, 0);
  f.engine.check_invariants();
  if (r.ok()) REQUIRE(f.engine.free(r.ptr) == FreeStatus::ok);
  if (s.ok()) REQUIRE(f.engine.free(s.ptr) == FreeStatus::ok);
  auto t = f.engine.allocate(30 * MiB, 0);
  REQUIRE(t.ok());
  REQUIRE(f.engine.free(t.ptr) == FreeStatus::ok);
  f.engine.empty_cache();
  CHECK(f.source.physical_bytes() == 0);
}

TEST_CASE("a non-virtual-memory source gets classic segments", "[engine][classic]") {
  SimSourceOptions o;
  o.virtual_memory = false;
  Fixture f(test_config(true), o);
  auto a = f.engine.allocate(5 * MiB, 0);
  REQUIRE(a.ok());
  auto snap = f.engine.snapshot();
  REQUIRE(snap.segments.size() == 1);
  CHECK_FALSE(snap.segments[0].expandable);
  CHECK(snap.segments[0].size_bytes == 20 * MiB);
  REQUIRE(f.engine.free(a.ptr) == FreeStatus::ok);
}

TEST_CASE("observers see one event per state change, in order", "[engine][events]") {
  Fixture f;
  auto rec = std::make_shared<Recorder>();
  f.engine.attach_observer(rec);
  void* a = f.alloc(30 * MiB);
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  CHECK(rec->count(EventKind::segment_map) == 2);
  CHECK(rec->count(EventKind::alloc) == 1);
  CHECK(rec->count(EventKind::free_requested) == 1);
  CHECK(rec->count(EventKind::free_completed) == 1);
  for (std::size_t i = 1; i < rec->events.size(); ++i) CHECK(rec->events[i].seq > rec->events[i - 1].seq);
  const auto& alloc = rec->events[2];
  CHECK(alloc.kind == EventKind::alloc);
  CHECK(alloc.requested_bytes == 30 * MiB);
  CHECK(alloc.addr == reinterpret_cast<std::uintptr_t>(a));
  f.engine.empty_cache();
  CHECK(rec->count(EventKind::segment_unmap) == 2);
  CHECK(rec->count(EventKind::empty_cache) == 1);
  auto oom = f.engine.allocate(std::size_t{1} << 61, 0);
  CHECK_FALSE(oom.ok());
  CHECK(rec->count(EventKind::oom) == 1);
  f.engine.detach_observer(rec.get());
  f.alloc(512);
  CHECK(rec->count(EventKind::alloc) == 1);
}

TEST_CASE("lookup finds the block and its segment", "[engine]") {
  Fixture f;
  void* a = f.alloc(3 * MiB);
  auto l = f.engine.lookup(a);
  REQUIRE(l.has_value());
  CHECK(l->block_addr == reinterpret_cast<std::uintptr_t>(a));
  CHECK(l->block_size_bytes == 3 * MiB);
  CHECK(l->expandable);
  CHECK_FALSE(f.engine.lookup(static_cast<char*>(a) + 512).has_value());
  REQUIRE(f.engine.free(a) == FreeStatus::ok);
  CHECK(f.engine.largest_free_block_bytes() == 20 * MiB);
}

TEST_CASE("size zero returns null without error", "[engine]") {
  Fixture f;
  auto r = f.engine.allocate(0, 0);
  CHECK(r.ok());
  CHECK(r.ptr == nullptr);
}
