// The PyTorch 2.11 allocator model on small handmade sequences whose results were worked out by
// hand from the algorithm (PyTorch 2.11's c10/cuda/CUDACachingAllocator.cpp; pytorch_policy.h).
#include "catch.h"

#include "gpumem/forensics/pytorch_policy.h"

using gpumem::forensics::PytorchModelOptions;
using gpumem::forensics::PytorchPolicy;
using gpumem::forensics::WasteBreakdown;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

std::uint64_t must_alloc(PytorchPolicy& p, std::size_t size, std::uint64_t stream = 0) {
  const auto a = p.allocate(size, stream);
  REQUIRE(a.has_value());
  p.check_invariants();
  return *a;
}

void must_free(PytorchPolicy& p, std::uint64_t addr) {
  p.free(addr);
  p.check_invariants();
}

void check_sums(const PytorchPolicy& p) {
  const WasteBreakdown w = p.breakdown();
  CHECK(w.reserved_bytes == p.reserved_bytes());
  CHECK(w.allocated_bytes == p.allocated_bytes());
  CHECK(w.requested_bytes + w.rounding_bytes + w.inactive_split_bytes + w.cached_free_bytes +
            w.partly_used_granule_bytes ==
        w.reserved_bytes);
}

PytorchPolicy classic(PytorchModelOptions o = {}) { return PytorchPolicy("pytorch", o); }
PytorchPolicy expandable(PytorchModelOptions o = {}) {
  o.expandable_segments = true;
  return PytorchPolicy("pytorch:expandable", o);
}

}  // namespace

TEST_CASE("requests are rounded to 512 bytes", "[pytorch_model]") {
  PytorchPolicy p = classic();
  CHECK(p.round_size(1) == 512);
  CHECK(p.round_size(512) == 512);
  CHECK(p.round_size(513) == 1024);
  CHECK(p.round_size(MiB + 1) == MiB + 512);
}

TEST_CASE("roundup_power2_divisions rounds to the next 1/N step between powers of two", "[pytorch_model]") {
  PytorchModelOptions o;
  o.roundup_power2_divisions.fill(4);
  PytorchPolicy p = classic(o);
  // 1200 lies in [1024, 2048); quarters are 1024, 1280, 1536, 1792 -> 1280. But 1200 is not
  // above 512 x 4 = 2048, so plain 512-byte rounding applies: 1536.
  CHECK(p.round_size(1200) == 1536);
  // 5 MiB + 1 in [4, 8) MiB: steps of 1 MiB -> 6 MiB. Powers of two stay.
  CHECK(p.round_size(5 * MiB + 1) == 6 * MiB);
  CHECK(p.round_size(8 * MiB) == 8 * MiB);
}

TEST_CASE("small requests share 2 MiB segments and split", "[pytorch_model]") {
  PytorchPolicy p = classic();
  const auto a = must_alloc(p, 400);  // 512-byte block of a new 2 MiB small segment
  CHECK(p.reserved_bytes() == 2 * MiB);
  CHECK(p.allocated_bytes() == 512);
  const auto b = must_alloc(p, 1000);  // 1024 bytes, cut from the same segment right after a
  CHECK(b == a + 512);
  CHECK(p.reserved_bytes() == 2 * MiB);
  CHECK(p.counters().creates == 1);
  CHECK(p.counters().segments == 1);
  const WasteBreakdown w = p.breakdown();
  CHECK(w.rounding_bytes == (512 - 400) + (1024 - 1000));
  CHECK(w.inactive_split_bytes == 2 * MiB - 1536);  // the rest of a segment in use
  check_sums(p);
}

TEST_CASE("pool choice: up to 1 MiB is small, above is large", "[pytorch_model]") {
  PytorchPolicy p = classic();
  must_alloc(p, MiB);  // exactly 1 MiB: small pool, 2 MiB segment
  CHECK(p.reserved_bytes() == 2 * MiB);
  must_alloc(p, MiB + 1);  // large pool, 1-10 MiB: a 20 MiB segment
  CHECK(p.reserved_bytes() == 22 * MiB);
  // 12 MiB + 1 fits the 20 MiB segment's free remainder (19 MiB - 512): no new segment.
  must_alloc(p, 12 * MiB + 1);
  CHECK(p.reserved_bytes() == 22 * MiB);
  // Another one does not fit the ~7 MiB left: >= 10 MiB gets its own segment of 14 MiB.
  must_alloc(p, 12 * MiB + 1);
  CHECK(p.reserved_bytes() == 36 * MiB);
  CHECK(p.counters().segments == 3);
  check_sums(p);
}

TEST_CASE("large blocks split only when more than 1 MiB remains", "[pytorch_model]") {
  PytorchPolicy p = classic();
  const auto a = must_alloc(p, 5 * MiB);  // 20 MiB segment, 15 MiB remains cached
  CHECK(p.allocated_bytes() == 5 * MiB);
  const auto b = must_alloc(p, 14 * MiB + 512 * 1024);  // 15 MiB block, 0.5 MiB left: no split
  CHECK(b == a + 5 * MiB);
  CHECK(p.allocated_bytes() == 20 * MiB);
  CHECK(p.reserved_bytes() == 20 * MiB);
  const WasteBreakdown w = p.breakdown();
  CHECK(w.rounding_bytes == 512 * 1024);
  CHECK(w.inactive_split_bytes == 0);
  check_sums(p);
}

TEST_CASE("a 12 MiB + 1 request gets a 14 MiB segment and leaves a split remainder", "[pytorch_model]") {
  PytorchPolicy p = classic();
  must_alloc(p, 12 * MiB + 1);
  CHECK(p.reserved_bytes() == 14 * MiB);
  CHECK(p.allocated_bytes() == 12 * MiB + 512);
  CHECK(p.breakdown().inactive_split_bytes == 2 * MiB - 512);
}

TEST_CASE("freed blocks merge back into their segment", "[pytorch_model]") {
  PytorchPolicy p = classic();
  const auto a = must_alloc(p, 5 * MiB);
  const auto b = must_alloc(p, 5 * MiB);
  CHECK(b == a + 5 * MiB);
  must_free(p, a);
  // a's 5 MiB and the 10 MiB tail are free but the segment is split by b.
  CHECK(p.breakdown().inactive_split_bytes == 15 * MiB);
  CHECK(p.breakdown().cached_free_bytes == 0);
  must_free(p, b);
  CHECK(p.breakdown().inactive_split_bytes == 0);
  CHECK(p.breakdown().cached_free_bytes == 20 * MiB);
  // The merged 20 MiB block serves a request that needs all of it, at the segment's start.
  CHECK(must_alloc(p, 20 * MiB - 100) == a);
  CHECK(p.counters().creates == 1);
}

TEST_CASE("best fit takes the smallest cached block that fits", "[pytorch_model]") {
  PytorchPolicy p = classic();
  const auto s12 = must_alloc(p, 12 * MiB);  // 12 MiB segment, used whole
  const auto s16 = must_alloc(p, 16 * MiB);  // 16 MiB segment
  must_free(p, s12);
  must_free(p, s16);
  CHECK(must_alloc(p, 11 * MiB) == s12);  // 12 MiB fits best; 1 MiB left is not > 1 MiB: whole
  CHECK(p.allocated_bytes() == 12 * MiB);
  CHECK(must_alloc(p, 11 * MiB) == s16);  // then the 16 MiB block, split (5 MiB left)
  CHECK(p.allocated_bytes() == 23 * MiB);
  CHECK(p.reserved_bytes() == 28 * MiB);
  CHECK(p.counters().creates == 2);
}

TEST_CASE("cached blocks stay on their stream", "[pytorch_model]") {
  PytorchPolicy p = classic();
  const auto a = must_alloc(p, 12 * MiB, /*stream=*/0);
  must_free(p, a);
  const auto b = must_alloc(p, 12 * MiB, /*stream=*/7);  // the free block belongs to stream 0
  CHECK(b != a);
  CHECK(p.reserved_bytes() == 24 * MiB);
  CHECK(must_alloc(p, 12 * MiB, 0) == a);
}

TEST_CASE("oversize blocks with max_split_size", "[pytorch_model]") {
  PytorchModelOptions o;
  o.max_split_size_bytes = 64 * MiB;
  PytorchPolicy p = classic(o);
  const auto big = must_alloc(p, 100 * MiB);
  must_free(p, big);
  // 30 MiB is below max_split_size: an oversize block may not serve it -> a new segment.
  const auto small = must_alloc(p, 30 * MiB);
  CHECK(small != big);
  CHECK(p.reserved_bytes() == 130 * MiB);
  // 70 MiB: the 100 MiB block is >= 70 + 20 (max_non_split_rounding) -> a new 70 MiB segment.
  const auto mid = must_alloc(p, 70 * MiB);
  CHECK(mid != big);
  CHECK(p.reserved_bytes() == 200 * MiB);
  // 90 MiB: 100 < 90 + 20 -> served by the oversize block, which is not split.
  CHECK(must_alloc(p, 90 * MiB) == big);
  CHECK(p.allocated_bytes() == 30 * MiB + 70 * MiB + 100 * MiB);
  check_sums(p);
}

TEST_CASE("max_split_size keeps large blocks whole", "[pytorch_model]") {
  PytorchModelOptions o;
  o.max_split_size_bytes = 64 * MiB;
  PytorchPolicy p = classic(o);
  must_alloc(p, 80 * MiB);  // 80 MiB >= max_split_size: not split even with room
  CHECK(p.breakdown().inactive_split_bytes == 0);
}

TEST_CASE("under a cap, cached segments are freed and the allocation retried", "[pytorch_model]") {
  PytorchModelOptions o;
  o.cap_bytes = 64 * MiB;
  PytorchPolicy p = classic(o);
  const auto a = must_alloc(p, 40 * MiB);
  must_free(p, a);
  // 50 MiB: nothing cached fits and 40 + 50 > 64 -> free the cached 40 MiB segment, retry.
  must_alloc(p, 50 * MiB);
  CHECK(p.reserved_bytes() == 50 * MiB);
  CHECK(p.counters().alloc_retries == 1);
  CHECK(p.counters().releases == 1);
  // 30 MiB more cannot fit under the cap even after the retry.
  CHECK_FALSE(p.allocate(30 * MiB, 0).has_value());
  CHECK(p.counters().alloc_retries == 2);
  CHECK(p.reserved_bytes() == 50 * MiB);
}

TEST_CASE("release_available_cached_blocks frees oversize blocks first", "[pytorch_model]") {
  PytorchModelOptions o;
  o.cap_bytes = 150 * MiB;
  o.max_split_size_bytes = 64 * MiB;
  PytorchPolicy p = classic(o);
  const auto a = must_alloc(p, 100 * MiB);
  must_alloc(p, 2 * MiB);  // a 20 MiB segment that stays in use
  must_free(p, a);
  // 70 MiB: the cached oversize 100 MiB block is >= 70 + 20, so it may not serve it; a new
  // 70 MiB segment would pass the cap (120 + 70 > 150). The smallest oversize block >= 70 MiB is
  // released (no full retry) and the segment fits.
  must_alloc(p, 70 * MiB);
  CHECK(p.counters().alloc_retries == 0);
  CHECK(p.counters().releases == 1);
  CHECK(p.reserved_bytes() == 90 * MiB);
}

TEST_CASE("when oversize releases are not enough, every unsplit block goes and it retries", "[pytorch_model]") {
  PytorchModelOptions o;
  o.cap_bytes = 200 * MiB;
  o.max_split_size_bytes = 64 * MiB;
  PytorchPolicy p = classic(o);
  const auto a = must_alloc(p, 100 * MiB);
  must_alloc(p, 2 * MiB);  // 20 MiB segment, split: its free 18 MiB cannot be released
  must_free(p, a);
  // 120 MiB: 120 + 120 > 200; the oversize blocks add up to 100 < 120 (released anyway, the
  // step fails), then the full release frees nothing more and the retry succeeds.
  must_alloc(p, 120 * MiB);
  CHECK(p.counters().alloc_retries == 1);
  CHECK(p.counters().releases == 1);
  CHECK(p.reserved_bytes() == 140 * MiB);
}

TEST_CASE("expandable segments grow in 20 MiB pages and merge", "[pytorch_model]") {
  PytorchPolicy p = expandable();
  const auto a = must_alloc(p, 5 * MiB);  // maps one 20 MiB page; 15 MiB stays free
  CHECK(p.reserved_bytes() == 20 * MiB);
  CHECK(p.counters().creates == 1);
  CHECK(p.counters().maps == 1);
  CHECK(p.counters().segments == 1);
  // 30 MiB: the free 15 MiB at the end plus one more page (35 MiB) -> served at a + 5 MiB.
  const auto b = must_alloc(p, 30 * MiB);
  CHECK(b == a + 5 * MiB);
  CHECK(p.reserved_bytes() == 40 * MiB);
  CHECK(p.counters().maps == 2);
  CHECK(p.counters().segments == 1);
  // Small requests get their own region with 2 MiB pages.
  must_alloc(p, 1000);
  CHECK(p.reserved_bytes() == 42 * MiB);
  CHECK(p.counters().segments == 2);
  WasteBreakdown w = p.breakdown();
  CHECK(w.partly_used_granule_bytes == 5 * MiB + (2 * MiB - 1024));  // page 1 tail, small page
  CHECK(w.cached_free_bytes == 0);
  CHECK(w.inactive_split_bytes == 0);
  check_sums(p);
  must_free(p, a);
  must_free(p, b);
  w = p.breakdown();
  CHECK(w.cached_free_bytes == 40 * MiB);  // both pages wholly free
  // empty_cache unmaps the free pages and drops the emptied large region.
  p.empty_cache();
  p.check_invariants();
  CHECK(p.reserved_bytes() == 2 * MiB);
  CHECK(p.counters().unmaps == 2);
  CHECK(p.counters().releases == 2);
  CHECK(p.counters().segments == 1);
}

TEST_CASE("expandable best fit values a block at its size plus the unmapped space after it", "[pytorch_model]") {
  PytorchPolicy p = expandable();
  const auto a = must_alloc(p, 8 * MiB);  // [0, 8)
  const auto b = must_alloc(p, 4 * MiB);  // [8, 12)
  must_alloc(p, 4 * MiB);                 // [12, 16); [16, 20) stays free next to unmapped space
  CHECK(b == a + 8 * MiB);
  must_free(p, a);  // an interior 8 MiB hole
  // The 4 MiB tail is the smallest block, but counted with the space it can grow into it is
  // huge: the 8 MiB hole is the better fit.
  CHECK(must_alloc(p, 3 * MiB) == a);
  CHECK(p.reserved_bytes() == 20 * MiB);
}

TEST_CASE("classic best fit takes the smaller block where expandable would not", "[pytorch_model]") {
  PytorchPolicy p = classic();
  const auto a = must_alloc(p, 8 * MiB);
  must_alloc(p, 4 * MiB);
  const auto c = must_alloc(p, 4 * MiB);  // [16, 20) stays free (4 MiB, split remainder)
  must_free(p, a);
  CHECK(must_alloc(p, 3 * MiB) == c + 4 * MiB);
}

TEST_CASE("the lowest address with room is used when an expandable segment grows", "[pytorch_model]") {
  PytorchPolicy p = expandable();
  const auto a = must_alloc(p, 20 * MiB);  // page 0 whole
  const auto b = must_alloc(p, 20 * MiB);  // page 1 whole
  CHECK(b == a + 20 * MiB);
  must_free(p, a);
  p.empty_cache();  // page 0 is unmapped: a hole at the start of the region
  CHECK(p.reserved_bytes() == 20 * MiB);
  const auto c = must_alloc(p, 10 * MiB);  // the hole is the lowest room: remapped there
  CHECK(c == a);
  CHECK(p.reserved_bytes() == 40 * MiB);
  CHECK(p.counters().maps == 3);
}
