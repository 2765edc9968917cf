// RegionMap (region_map.h) on its own: regions, split/merge/carve, best fit, and the claims growth
// and release make while the engine's lock is dropped (claim, record mapped/unmapped, unclaim).
#include <string>
#include <vector>

#include "catch.h"
#include "region_map.h"

using namespace gpumem::alloc;
using namespace gpumem::alloc::detail;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kPiece = 2 * MiB;
constexpr std::uintptr_t kBase = 0x7f0000000000;

// "F2 U8": the region's blocks as state letters and sizes in MiB (F free, U unmapped, C claimed,
// A allocated), after checking they tile the region and sit in the right containers.
std::string layout(RegionMap& map, const Region& r) {
  std::string out;
  std::uintptr_t at = r.va.base;
  std::size_t unmapped = 0;
  for (const Block* b = r.first; b; b = b->next) {
    REQUIRE(b->addr == at);
    at = b->end();
    char c = '?';
    switch (BlockState(b->state)) {
      case BlockState::free:
        c = 'F';
        CHECK(map.index_of(r).contains(*b));
        break;
      case BlockState::unmapped:
        c = 'U';
        ++unmapped;
        break;
      case BlockState::claimed: c = 'C'; break;
      case BlockState::allocated: c = 'A'; break;
      default: break;
    }
    if (!out.empty()) out += ' ';
    out += c;
    out += std::to_string(b->size_bytes / MiB);
  }
  CHECK(at == r.va.end());
  CHECK(unmapped == r.unmapped.size());
  CHECK(map.index_of(r).check_order());
  return out;
}

// Maps slots [first, last] the way growth does: claim, record each one-slot piece mapped, unclaim.
void map_slots(RegionMap& map, Region& r, std::size_t first, std::size_t last) {
  std::vector<Block*> claimed;
  map.claim_range(r.first, r.slot_addr(first), r.slot_addr(last) + r.slot_bytes, claimed);
  for (std::size_t s = first; s <= last; ++s) map.record_piece_mapped(r, s, 1, 100 + s);
  for (Block* b : claimed) map.unclaim(b);
}

}  // namespace

TEST_CASE("region map: an expandable region starts as one unmapped block", "[region_map]") {
  RegionMap map;
  map.tick = 41;
  Region* r = map.add_region({kBase, 10 * kPiece}, PoolKind::large, 3, true, kPiece);
  CHECK(r->created_seq == 42);
  CHECK(r->slot_count() == 10);
  CHECK(r->slots.empty());  // grown as slots are mapped
  CHECK(map.va_bytes == 10 * kPiece);
  CHECK(layout(map, *r) == "U20");
  CHECK(map.region_of(kBase + 5) == r);
  CHECK(map.region_of(kBase + 10 * kPiece) == nullptr);
  map.drop_region(*r);
  CHECK(map.regions.empty());
  CHECK(map.va_bytes == 0);
}

TEST_CASE("region map: claiming a range, mapping it and unclaiming gives one free block", "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 10 * kPiece}, PoolKind::large, 0, true, kPiece);
  std::vector<Block*> claimed;
  map.claim_range(r.first, r.slot_addr(2), r.slot_addr(5), claimed);
  CHECK(layout(map, r) == "U4 C6 U10");
  CHECK(map.claimed_blocks == 1);
  CHECK(r.claims == 1);
  map.record_piece_mapped(r, 2, 3, 9);  // one piece of three slots
  CHECK(r.mapped_bytes == 3 * kPiece);
  CHECK(r.pieces == 1);
  CHECK(r.piece_first(4) == 2);
  CHECK(r.piece_slots(3) == 3);
  Block* f = map.unclaim(claimed[0]);
  REQUIRE(f != nullptr);
  CHECK(f->addr == r.slot_addr(2));
  CHECK(layout(map, r) == "U4 F6 U10");
  CHECK(map.claimed_blocks == 0);
  CHECK(r.claims == 0);
}

TEST_CASE("region map: a claim across free and unmapped blocks splits free ones at its ends", "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 10 * kPiece}, PoolKind::large, 0, true, kPiece);
  map_slots(map, r, 0, 3);  // F8 U12
  REQUIRE(layout(map, r) == "F8 U12");
  std::vector<Block*> claimed;
  // From 3 MiB (inside the free run) to the end of slot 5.
  map.claim_range(r.first, kBase + 3 * MiB, r.slot_addr(6), claimed);
  CHECK(layout(map, r) == "F3 C5 C4 U8");
  REQUIRE(claimed.size() == 2);
  CHECK(claimed[0]->addr == kBase + 3 * MiB);
  CHECK(claimed[1]->addr == r.slot_addr(4));
  // Nothing mapped after all: each goes back to what its slots are, merged.
  for (Block* b : claimed) map.unclaim(b);
  CHECK(layout(map, r) == "F8 U12");
}

TEST_CASE("region map: unclaim after a partial mapping splits by slot", "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 10 * kPiece}, PoolKind::large, 0, true, kPiece);
  std::vector<Block*> claimed;
  map.claim_range(r.first, r.slot_addr(1), r.slot_addr(5), claimed);
  map.record_piece_mapped(r, 1, 1, 1);
  map.record_piece_mapped(r, 2, 1, 2);  // the third map "failed"
  map.unclaim(claimed[0]);
  CHECK(layout(map, r) == "U2 F4 U14");
  CHECK(r.mapped_bytes == 2 * kPiece);
}

TEST_CASE("region map: claiming a piece of a free block for recycling, then recording it unmapped",
          "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 10 * kPiece}, PoolKind::large, 0, true, kPiece);
  map_slots(map, r, 0, 4);  // F10 U10
  Block* front = r.first;
  Block* slot = map.claim_piece(front, 4);  // the highest: front keeps the part below
  CHECK(layout(map, r) == "F8 C2 U10");
  CHECK(r.first == front);
  Block* slot2 = map.claim_piece(front, 2);
  CHECK(layout(map, r) == "F4 C2 F2 C2 U10");
  map.record_piece_unmapped(slot);  // merges with the unmapped run above
  CHECK(layout(map, r) == "F4 C2 F2 U12");
  CHECK(r.mapped_bytes == 4 * kPiece);
  CHECK(r.pieces == 4);
  CHECK_FALSE(r.slot_mapped(4));
  map.unclaim(slot2);  // the unmap failed: free again, merged with both neighbours
  CHECK(layout(map, r) == "F8 U12");
  CHECK(map.claimed_blocks == 0);
}

TEST_CASE("region map: a piece of several slots is claimed and unmapped whole", "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 10 * kPiece}, PoolKind::large, 0, true, kPiece);
  std::vector<Block*> claimed;
  map.claim_range(r.first, r.slot_addr(0), r.slot_addr(6), claimed);
  map.record_piece_mapped(r, 0, 2, 1);
  map.record_piece_mapped(r, 2, 4, 2);
  for (Block* b : claimed) map.unclaim(b);
  REQUIRE(layout(map, r) == "F12 U8");
  Block* piece = map.claim_piece(r.first, 2);  // slots 2-5: one piece of 8 MiB
  CHECK(layout(map, r) == "F4 C8 U8");
  map.record_piece_unmapped(piece);
  CHECK(layout(map, r) == "F4 U16");
  CHECK(r.mapped_bytes == 2 * kPiece);
  CHECK(r.pieces == 1);
  CHECK(map.claimed_blocks == 0);
}

TEST_CASE("region map: best fit, carve and free-merging", "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 10 * kPiece}, PoolKind::large, 0, true, kPiece);
  map_slots(map, r, 0, 4);  // F10 U10
  const policy::SplitLimits limits;
  Block* a = map.take_cached(PoolKind::large, 0, 3 * MiB, limits);
  REQUIRE(a != nullptr);
  CHECK(a->addr == kBase);
  a->state = BlockState::allocated;
  CHECK(layout(map, r) == "A3 F7 U10");
  CHECK(map.take_cached(PoolKind::large, 1, MiB, limits) == nullptr);  // another stream
  CHECK(map.take_cached(PoolKind::large, 0, 8 * MiB, limits) == nullptr);
  // Carve a block out of the middle of the free run.
  Block* f = a->next;
  map.index_of(r).erase(*f);
  Block* mid = map.carve(f, kBase + 5 * MiB, 2 * MiB);
  mid->state = BlockState::allocated;
  CHECK(layout(map, r) == "A3 F2 A2 F3 U10");
  // Freeing both merges everything back.
  mid->state = BlockState::free;
  map.insert_free_merged(mid);
  a->state = BlockState::free;
  map.insert_free_merged(a);
  CHECK(layout(map, r) == "F10 U10");
}

TEST_CASE("region map: a classic segment is one free block; claimed whole, it can be dropped", "[region_map]") {
  RegionMap map;
  Region& r = *map.add_region({kBase, 20 * MiB}, PoolKind::large, 0, false, 20 * MiB);
  CHECK(r.mapped_bytes == 20 * MiB);
  CHECK(r.first->state == BlockState::free);
  map.index_of(r).insert(*r.first);
  const policy::SplitLimits limits;
  // 19 MiB leaves 1 MiB: not over 1 MiB, so the classic large pool does not split.
  Block* b = map.take_cached(PoolKind::large, 0, 19 * MiB, limits);
  REQUIRE(b == r.first);
  CHECK(b->size_bytes == 20 * MiB);
  b->state = BlockState::free;
  map.insert_free_merged(b);
  map.claim_block(b);
  CHECK(layout(map, r) == "C20");
  map.drop_region(r);
  CHECK(map.regions.empty());
  CHECK(map.claimed_blocks == 0);
}
