// Config: the engine's settings. One immutable value, parsed once, validated, passed to the
// CachingAllocator's constructor; nothing reads configuration mid-algorithm. It holds the keys the
// engine uses and nothing else: which memory source to build, tracing and the OOM postmortem
// belong to the layers above (torch::AdapterConfig, forensics::Config), and gpumem::torch::Config
// joins the three for the string users write (GPUMEM_ALLOC_CONF: docs/config.md).
//
// parse_config() parses a string of engine keys only (for programs that drive the engine
// directly: replay policies, benchmarks, tests); the syntax is PYTORCH_CUDA_ALLOC_CONF's
// (gpumem/alloc/config_syntax.h). The keys keep PyTorch 2.11's meaning where PyTorch has them.
//
// Thread-safety: a plain value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpumem/alloc/config_syntax.h"

namespace gpumem::alloc {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;
inline constexpr std::size_t kNoLimit = std::numeric_limits<std::size_t>::max();
// The most engines a device may have (Config::arenas).
inline constexpr unsigned kMaxArenas = 64;
// Config::arenas's value for arenas:auto (the default), and the engines per device it allows
// (docs/notes/thread-caches.md, "Arenas by default").
inline constexpr unsigned kArenasAuto = 0;
inline constexpr unsigned kAutoArenas = 4;
// What recycle_churn adds to the memory guard's slack and ceiling while recycling churns.
inline constexpr double kChurnAllowance = 0.1;

// How the physical pieces of expandable regions are sized (the `pieces` key).
enum class PieceSizing : std::uint8_t {
  adaptive,  // pieces follow the requests (docs/notes/allocation-policy.md)
  fixed,     // PyTorch's pages: large_segment_size_mb in the large pool, small_piece_size_mb in the small
};

// How recycling learns that a wholly free piece's memory is idle on the GPU before it unmaps the
// piece or hands it to another stream (the `recycle_wait` key; Note [Physical page recycling],
// "Fences instead of waits").
enum class RecycleWait : std::uint8_t {
  fence,  // fence events recorded at growths and queried (never waited for): a piece not known idle
          // is not moved, growth creates instead; the stream synchronization only past the cap
  sync,   // synchronize the piece's stream before the move (the behaviour before fences)
};

struct Config {
  // ---- PyTorch 2.11 keys ----
  // expandable_segments:True|False. gpumem defaults to True: one growing virtual region per
  // (stream, pool), physical pieces mapped on demand and recycled.
  bool expandable_segments = true;
  // max_split_size_mb: blocks at least this large are never split (classic segments only).
  std::size_t max_split_size_bytes = kNoLimit;
  // max_non_split_rounding_mb: an oversize cached block serves a request only if it is smaller
  // than request + this. Default = large_segment_size_bytes.
  std::size_t max_non_split_rounding_bytes = 20 * kMiB;
  // large_segment_size_mb: segment size for 1-10 MiB requests in classic mode, and the physical
  // piece size of the large pool in expandable mode with pieces:fixed. > 10 MiB.
  std::size_t large_segment_size_bytes = 20 * kMiB;
  // roundup_power2_divisions: per power-of-two bucket [2^i MiB, 2^(i+1) MiB), i = 0..15; 0 = off.
  std::array<std::uint32_t, 16> roundup_power2_divisions{};
  // garbage_collection_threshold: in (0,1); 0 = off. Active only with a memory cap.
  double garbage_collection_threshold = 0.0;
  // per_process_memory_fraction: [0,1]; 1 = no fraction cap. The fraction applies to the memory
  // source's total; when the source cannot say (total 0) only memory_limit_bytes caps.
  double per_process_memory_fraction = 1.0;

  // ---- gpumem's own keys ----
  // memory_limit_mb: absolute cap on reserved bytes (0 = none). With a fraction too, the smaller
  // of the two applies.
  std::size_t memory_limit_bytes = 0;
  // small_piece_size_mb: the smallest physical piece: the slot of every expandable region, and the
  // piece size of the small pool (a multiple of the granularity).
  std::size_t small_piece_bytes = 2 * kMiB;
  // pieces:adaptive|fixed: how the pieces of expandable regions are sized (PieceSizing).
  PieceSizing pieces = PieceSizing::adaptive;
  // max_piece_size_mb: with pieces:adaptive, the longest piece of the large pool (a multiple of
  // 2 MiB; rounded down to whole small pieces, at least one). Shorter pieces fit more holes when
  // they move, longer ones need fewer driver calls (docs/notes/allocation-policy.md).
  std::size_t max_piece_bytes = 8 * kMiB;
  // frontier_piece_size_mb: with pieces:adaptive, the longest piece a growth creates at a region's
  // end when it moves no free piece (the footprint being built), a multiple of 2 MiB; 0 = off
  // (max_piece_size_mb applies there too). Fewer, longer driver calls while the footprint grows, at
  // the cost of pieces that fit fewer holes when they move later (docs/notes/allocation-policy.md,
  // "How far the whole-run VMM share can go").
  std::size_t frontier_piece_bytes = 0;
  // short_pieces_below_mb: with pieces:adaptive, while the engine reserves less than this, the
  // large pool's pieces are one slot (2 MiB) long, whatever max_piece_size_mb says; 0 = off.
  std::size_t short_pieces_below_bytes = 0;
  // footprint_pieces: with pieces:adaptive, no large-pool piece a growth creates is longer than the
  // engine's footprint (reserved bytes) / this, nor shorter than one slot (2 MiB); 0 = off
  // (max_piece_size_mb alone). Pieces follow the footprint: with 512, 2 MiB below 2 GiB reserved,
  // 8 MiB (max_piece_size_mb) from 4 GiB (docs/notes/allocation-policy.md, "Pieces that follow the
  // footprint").
  std::size_t footprint_pieces = 512;
  // recycle:True|False: physical page recycling (map wholly free pieces where a request lands
  // instead of creating new memory).
  bool recycle = true;
  // recycle_budget: the share of elapsed time recycling may spend on driver calls (unmap + map of
  // the pieces it moves), in [0, 1]; 1 = no budget. Past it, growth creates new pieces instead of
  // moving free ones (docs/notes/allocation-policy.md, "The recycle budget"). The default (0, with
  // no burst: no driver time for recycling) leaves every growth to the memory guard
  // (recycle_slack): "the guard decides".
  double recycle_budget = 0.0;
  // recycle_burst_ms: driver time recycling may spend before the budget applies (the warm-up), and
  // the most the budget saves up while recycling is idle. Whole milliseconds.
  std::size_t recycle_burst_ms = 0;
  // recycle_slack: the most memory growth past the recycle budget may buy (reserve beyond what
  // recycling alone would have, estimated), as a share of the rest of the footprint, in [0, 1];
  // past it, recycling goes on whatever it costs.
  double recycle_slack = 0.008;
  // recycle_ceiling: the guard's second bound: growth past the recycle budget buys memory only
  // while the footprint stays within (1 + this) x the most memory ever in use, in [0, 1); 0 = no
  // such bound (docs/notes/allocation-policy.md, "The guard's ceiling").
  double recycle_ceiling = 0.015;
  // recycle_churn: while recycling's driver calls take at least this share of the recent time (a
  // sum decaying over 0.1 s), the memory guard may buy kChurnAllowance more of both its bounds
  // (slack and ceiling), in [0, 1); 0 = off. 0.3 by default: a program that spends under 30% of
  // its time moving pieces never sees it (docs/notes/allocation-policy.md, "The churn allowance").
  double recycle_churn = 0.3;
  // recycle_headroom: growth creates new memory instead of moving free pieces while the footprint
  // stays within (1 + this) x the most memory ever in use, in [0, 1); 0 = always recycle first
  // (docs/notes/allocation-policy.md, "Recycling only above the headroom").
  double recycle_headroom = 0.0;
  // recycle_keep_mappings:True|False: a recycled piece keeps its old mapping (a "ghost": address
  // space the engine never hands out, still mapped to the piece) instead of being unmapped, so a
  // piece that moves back costs no driver call (Note [Physical page recycling], "Kept mappings").
  // False: unmap at once, so a stale pointer into the old place faults instead of reading the
  // piece's new block (a debugging setting).
  bool recycle_keep_mappings = true;
  // recycle_wait:fence|sync: how a move that needs the piece idle on the GPU (an unmap, a change
  // of stream, a kept mapping in the way) learns it is: `fence` queries fence events recorded at
  // earlier growths and leaves a piece not yet known idle where it is (growth creates instead; it
  // waits only when creating would pass the cap or the provider refuses); `sync` synchronizes the
  // stream, draining its queue (Note [Physical page recycling], "Fences instead of waits").
  RecycleWait recycle_wait = RecycleWait::fence;
  // recycle_overhang:True|False: with pieces:adaptive, when no wholly free piece fits the rest of
  // what a growth maps, a longer one may move there if the slots after it are unmapped, covering
  // the rest and reaching into the hole, instead of new memory being created for the rest
  // (docs/notes/allocation-policy.md, "Overhang").
  bool recycle_overhang = true;
  // thread_cache:True|False: per-thread caches (leases of free small-pool memory each thread
  // allocates in once threads contend for the engine).
  bool thread_cache = true;
  // arenas:N (1..64) or arenas:auto: up to N engines per device (docs/notes/thread-caches.md,
  // "Arenas"). With 1 one engine serves every thread. With more, a thread that keeps finding its
  // engine's lock taken gets an engine of its own (an arena: its own regions and free blocks,
  // nothing shared with the others but the memory source, the stream events and one cap), up to
  // N; threads that share an arena share its thread caches. Single-threaded programs never leave
  // the first.
  // auto (kArenasAuto, the default): kAutoArenas (engines_per_device).
  unsigned arenas = kArenasAuto;
  // step_plan:True|False (True, the default): a step planner in front of the engine (step_plan.h;
  // docs/notes/allocation-policy.md, "A step plan, replayed"). It finds a training step that
  // repeats on one stream, lays it out once in a range of the engine's memory, and places the
  // steps that repeat it there (no driver call); at the first request that differs the engine
  // serves as usual. With arenas it plans the first arena's steps, and stops for good once a thread
  // moves to an arena of its own (docs/notes/thread-caches.md, "The step planner with arenas").
  bool step_plan = true;
  // step_plan's layout runs on a thread of its own (StepPlanOptions::layout_thread), so that the
  // allocating thread never waits for it. No key: tests set it false to have each plan at the
  // event its step is found.
  bool step_plan_layout_thread = true;
  // va_reserve_mb: address space reserved per expandable region (0 = 1.125 x device memory).
  std::size_t va_reserve_bytes = 0;
  // check_invariants:True|False: run check_invariants() after every mutation (slow; tests).
  bool check_invariants = false;

  // Same settings (every field). parse_config(to_string(c)) == c for every Config parse_config
  // produces.
  friend bool operator==(const Config& a, const Config& b) noexcept = default;
};

// The engines a device may have under c: Config::arenas, or for arenas:auto kAutoArenas.
constexpr unsigned engines_per_device(const Config& c) noexcept {
  return c.arenas != kArenasAuto ? c.arenas : kAutoArenas;
}

// Parses a string of engine keys. Never throws; messages start with "gpumem config: ".
std::variant<Config, ConfigError> parse_config(std::string_view text);

// A canonical `key:value,...` string of every engine key (for snapshots and logs).
std::string to_string(const Config& config);

// The engine's keys (canonical names, then aliases), for docs, tests and messages.
std::vector<std::string_view> config_keys();

// The engine's keys bound to target, for a parse that joins several layers' keys
// (config_syntax::parse_config_text; gpumem::torch::parse_config does).
config_syntax::KeyTable config_key_table(Config& target);

}  // namespace gpumem::alloc
