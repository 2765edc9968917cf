// The engine's keys as the configuration tests exercise them, written once: both
// tests/allocator/test_config.cpp (alloc::parse_config, the engine's keys alone) and
// tests/torch/test_config.cpp (torch::parse_config, which parses the engine's keys with the
// adapter's and the forensics keys) round-trip them, so a new engine key added here is covered by
// both parses.
//
// Thread-safety: constants and pure functions.
#pragma once

#include <vector>

#include "catch.h"
#include "config_test_support.h"
#include "gpumem/alloc/config.h"

namespace gpumem::testing {

// Every engine key away from its default (alloc::Config{}), in one configuration string.
inline constexpr const char* kEngineKeysAwayFromDefault =
    "large_segment_size_mb:32,expandable_segments:False,max_split_size_mb:256,"
    "max_non_split_rounding_mb:48,roundup_power2_divisions:[2:4,128:2,>:16],"
    "garbage_collection_threshold:0.7,per_process_memory_fraction:0.3,"
    "memory_limit_mb:1000,small_piece_size_mb:4,max_piece_size_mb:16,frontier_piece_size_mb:32,short_pieces_below_mb:2048,footprint_pieces:256,recycle:False,recycle_budget:0.05,"
    "recycle_burst_ms:25,recycle_slack:0.5,recycle_ceiling:0.05,recycle_churn:0,recycle_keep_mappings:False,recycle_wait:sync,recycle_overhang:False,recycle_headroom:0.01,thread_cache:False,arenas:4,va_reserve_mb:4096,check_invariants:True";

// Checks that every field of c differs from the default's (c parsed from kEngineKeysAwayFromDefault).
inline void check_engine_fields_away_from_default(const alloc::Config& c) {
  const alloc::Config d;
  CHECK(c.large_segment_size_bytes != d.large_segment_size_bytes);
  CHECK(c.expandable_segments != d.expandable_segments);
  CHECK(c.max_split_size_bytes != d.max_split_size_bytes);
  CHECK(c.max_non_split_rounding_bytes != d.max_non_split_rounding_bytes);
  CHECK(c.roundup_power2_divisions != d.roundup_power2_divisions);
  CHECK(c.garbage_collection_threshold != d.garbage_collection_threshold);
  CHECK(c.per_process_memory_fraction != d.per_process_memory_fraction);
  CHECK(c.memory_limit_bytes != d.memory_limit_bytes);
  CHECK(c.small_piece_bytes != d.small_piece_bytes);
  CHECK(c.recycle != d.recycle);
  CHECK(c.recycle_budget != d.recycle_budget);
  CHECK(c.recycle_burst_ms != d.recycle_burst_ms);
  CHECK(c.recycle_slack != d.recycle_slack);
  CHECK(c.recycle_ceiling != d.recycle_ceiling);
  CHECK(c.recycle_churn != d.recycle_churn);
  CHECK(c.recycle_keep_mappings != d.recycle_keep_mappings);
  CHECK(c.recycle_wait != d.recycle_wait);
  CHECK(c.max_piece_bytes != d.max_piece_bytes);
  CHECK(c.frontier_piece_bytes != d.frontier_piece_bytes);
  CHECK(c.short_pieces_below_bytes != d.short_pieces_below_bytes);
  CHECK(c.footprint_pieces != d.footprint_pieces);
  CHECK(c.recycle_overhang != d.recycle_overhang);
  CHECK(c.recycle_headroom != d.recycle_headroom);
  CHECK(c.thread_cache != d.thread_cache);
  CHECK(c.arenas != d.arenas);
  CHECK(c.va_reserve_bytes != d.va_reserve_bytes);
  CHECK(c.check_invariants != d.check_invariants);
  CHECK_FALSE(c == d);
}

// The engine's keys and the values the seeded random configurations give them
// (check_random_round_trips).
inline const std::vector<KeyChoices>& engine_key_choices() {
  static const std::vector<KeyChoices> choices = {
      {"large_segment_size_mb", {"11", "20", "32", "64"}},
      {"expandable_segments", {"True", "False"}},
      {"max_split_size_mb", {"64", "100", "unlimited", "4096"}},
      {"max_non_split_rounding_mb", {"64", "80", "1000"}},
      {"roundup_power2_divisions", {"0", "2", "[1:2,>:8]", "[16:4,64:0,1024:2]", "[>:1]", "[2:8,4:4,8:2,16:1]"}},
      {"garbage_collection_threshold", {"0", "0.1", "0.3333333333333333", "0.95"}},
      {"per_process_memory_fraction", {"0", "0.5", "1", "0.123456789"}},
      {"memory_limit_mb", {"0", "1", "81920"}},
      {"small_piece_size_mb", {"2", "4", "16"}},
      {"max_piece_size_mb", {"2", "8", "20", "64"}},
      {"frontier_piece_size_mb", {"0", "16", "64"}},
      {"short_pieces_below_mb", {"0", "1024", "4096"}},
      {"footprint_pieces", {"0", "256", "512", "1024"}},
      {"va_reserve_mb", {"0", "65536"}},
      {"recycle", {"True", "False"}},
      {"recycle_budget", {"0", "1", "0.005", "0.02"}},
      {"recycle_burst_ms", {"0", "10", "3600000"}},
      {"recycle_slack", {"0", "0.02", "1"}},
      {"recycle_keep_mappings", {"True", "False"}},
      {"recycle_wait", {"fence", "sync"}},
      {"recycle_overhang", {"True", "False"}},
      {"recycle_ceiling", {"0", "0.015", "0.5"}},
      {"recycle_churn", {"0", "0.3", "0.5"}},
      {"recycle_headroom", {"0", "0.01", "0.5"}},
      {"thread_cache", {"True", "False"}},
      {"arenas", {"auto", "1", "2", "64"}},
      {"step_plan", {"True", "False"}},
      {"check_invariants", {"True", "False"}},
  };
  return choices;
}

}  // namespace gpumem::testing
