// Growth policy: how the engine grows when no cached block fits. Pure functions of plain values:
// the mechanism (expandable_growth.cpp, classic_growth.cpp) gathers the candidates, asks, and
// acts. See Note [Physical page recycling] in docs/notes/physical-page-recycling.md.
// Thread-safety: pure functions, callable from anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "gpumem/alloc/config.h"
#include "gpumem/alloc/stream_events.h"

namespace gpumem::alloc::policy {

// Address space an expandable region reserves: va_reserve_bytes if set, else 1.125 x the provider's
// total (PyTorch's choice), else (total unknown, 0) kUnknownTotalRegionVaBytes; at least one piece,
// rounded up to whole pieces.
inline constexpr std::size_t kUnknownTotalRegionVaBytes = std::size_t{256} << 30;
std::size_t region_va_bytes(std::size_t va_reserve_bytes, std::size_t provider_total_bytes,
                            std::size_t piece_bytes) noexcept;

// Classic (non-expandable) segment size for a rounded request: 2 MiB for the small pool, the large
// segment size for 1-10 MiB, else rounded up to 2 MiB (then to the source's granularity).
std::size_t classic_segment_bytes(std::size_t rounded_bytes, std::size_t large_segment_bytes,
                                  std::size_t granularity_bytes) noexcept;

// ---- placement: where in an expandable region a request lands

// Where a request of size_bytes may go in a hole [hole_lo, hole_hi) (a run of free and unmapped
// blocks at least size_bytes long): at its start, or at its end (rounded down to 512 bytes).
struct PlacementAddresses {
  std::uintptr_t addr[2] = {};
  int count = 0;
};
PlacementAddresses placement_addresses(std::uintptr_t hole_lo, std::uintptr_t hole_hi, std::size_t size_bytes) noexcept;

struct PlacementCandidate {
  std::uintptr_t addr = 0;
  std::size_t pieces_needed = 0;  // unmapped pieces under [addr, addr + size)
  std::size_t hole_bytes = 0;     // size of the hole it lies in
};

// The candidate needing the fewest new pieces; ties go to the smaller hole (keeps large holes for
// large requests), then the lower address (keeps regions compact). nullopt if there is none.
std::optional<std::size_t> choose_placement(std::span<const PlacementCandidate> candidates) noexcept;

// ---- recycling: which wholly free pieces move to where the request lands

// A free block of an expandable region of the growing pool, as the recycling choice sees it.
struct FreeExtent {
  std::uintptr_t addr = 0;
  std::size_t size_bytes = 0;
  StreamId stream = 0;
  std::uintptr_t region_base = 0;  // pieces are counted from here
};

struct RecycleChoice {
  std::size_t extent = 0;          // index into the extents given
  std::uintptr_t slot_addr = 0;    // the piece [slot_addr, slot_addr + piece_bytes) to move
};

// The highest whole piece of e outside [exclude_lo, exclude_hi) (the range the request takes), or
// nullopt.
std::optional<std::uintptr_t> highest_recyclable_slot(const FreeExtent& e, std::size_t piece_bytes,
                                                      std::uintptr_t exclude_lo, std::uintptr_t exclude_hi) noexcept;

// Up to max_count pieces to recycle, in the order they are taken: each time the highest recyclable
// piece of the *smallest* extent that holds one (ties: lower stream, then lower address), so large
// mapped free runs stay whole for large requests. Taking a piece leaves the part of the extent
// below it as a smaller extent (what is above it holds no recyclable piece). Every piece chosen is
// distinct; the result holds min(max_count, recyclable pieces) choices.
std::vector<RecycleChoice> choose_recycled_pieces(std::span<const FreeExtent> extents, std::size_t piece_bytes,
                                                  std::uintptr_t exclude_lo, std::uintptr_t exclude_hi,
                                                  std::size_t max_count);

// ---- how many pieces to recycle and to create

struct GrowthInputs {
  std::size_t pieces_needed = 0;
  std::size_t pieces_recyclable = 0;  // wholly free mapped pieces of the same pool elsewhere
  std::size_t piece_bytes = 0;
  std::size_t reserved_bytes = 0;
  std::size_t cap_bytes = kNoLimit;
  bool recycle_enabled = true;
};

struct GrowthPlan {
  std::size_t recycle = 0;  // pieces to unmap elsewhere and map here
  std::size_t create = 0;   // new pieces to create
  bool over_cap = false;    // creating them would pass the cap
};

// Recycle before creating: physical memory that is already held serves the request first, so
// reserved grows only when every piece of the pool is in use. Creating is refused past the cap.
GrowthPlan plan_growth(const GrowthInputs& in) noexcept;

}  // namespace gpumem::alloc::policy
