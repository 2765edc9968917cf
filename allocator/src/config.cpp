// The engine's configuration keys: PyTorch 2.11's allocator keys with PyTorch's meaning, plus
// gpumem's engine keys. docs/config.md documents every key; keep the key table below and that page
// in step (tests/allocator/test_config.cpp checks that the page names every key). The syntax and
// the parse itself are config_syntax.cpp's.
//
// large_segment_size_mb is applied first, because max_split_size_mb and max_non_split_rounding_mb
// are checked against it (PyTorch parses it first too), and it also sets the default of
// max_non_split_rounding_mb (PyTorch's default). va_reserve_mb is checked against both piece sizes
// once every key is applied.
//
// Where gpumem is looser than PyTorch (it accepts a few spellings PyTorch rejects, so that
// to_string can spell every setting): garbage_collection_threshold:0, roundup_power2_divisions:0
// and max_split_size_mb:unlimited all mean "off" (the default).
// Where it is stricter: numbers must be plain decimal digits ("12abc" is rejected, PyTorch reads
// 12), keys may not repeat (PyTorch keeps the last), and roundup_power2_divisions lists must give
// increasing boundaries of at most 32768 MB with '>' last.
#include "gpumem/alloc/config.h"

#include <algorithm>
#include <bit>
#include <iterator>

#include <fmt/format.h>

namespace gpumem::alloc {
namespace {

using config_syntax::Entry;
using config_syntax::fail;
using config_syntax::fail_value;
using config_syntax::Key;
using config_syntax::KeyInfo;
using config_syntax::want_bool;
using config_syntax::want_mib;
using config_syntax::want_number;
using config_syntax::want_scalar;
using config_syntax::want_uint;

constexpr std::uint64_t kLargeSegmentMinMiB = 10;           // PyTorch: must be > kMinLargeAlloc
constexpr std::uint64_t kMaxRoundupDivisions = 1ull << 31;  // fits the uint32 buckets
constexpr std::size_t kRoundupBuckets = 16;                 // [1 MiB, 2 MiB) ... [32 GiB, inf)

void apply_expandable_segments(const Entry& e, const KeyInfo& k, Config& c) {
  c.expandable_segments = want_bool(e, k);
}

void apply_large_segment_size(const Entry& e, const KeyInfo& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  if (mib <= kLargeSegmentMinMiB) fail_value(e, k, "is too small");
  c.large_segment_size_bytes = config_syntax::mib_to_bytes(e, k, mib);
  // PyTorch's default; max_non_split_rounding_mb, applied after this, overrides it.
  c.max_non_split_rounding_bytes = c.large_segment_size_bytes;
}

void apply_max_split_size(const Entry& e, const KeyInfo& k, Config& c) {
  if (want_scalar(e, k) == "unlimited") {
    c.max_split_size_bytes = kNoLimit;
    return;
  }
  std::size_t bytes = want_mib(e, k);
  if (bytes < c.large_segment_size_bytes)
    fail(fmt::format("{} is smaller than the large segment size ({} MiB); expected a whole number "
                     "of MiB >= {} (large_segment_size_mb) or unlimited, e.g. {}",
                     e.shown(), c.large_segment_size_bytes / kMiB, c.large_segment_size_bytes / kMiB,
                     k.example));
  c.max_split_size_bytes = bytes;
}

void apply_max_non_split_rounding(const Entry& e, const KeyInfo& k, Config& c) {
  std::size_t bytes = want_mib(e, k);
  if (bytes < c.large_segment_size_bytes)
    fail(fmt::format("{} is smaller than the large segment size ({} MiB); expected a whole number "
                     "of MiB >= {} (large_segment_size_mb), e.g. {}",
                     e.shown(), c.large_segment_size_bytes / kMiB, c.large_segment_size_bytes / kMiB,
                     k.example));
  c.max_non_split_rounding_bytes = bytes;
}

// One division count of roundup_power2_divisions (the scalar form or a list item's value).
std::uint32_t roundup_value(const Entry& e, const KeyInfo& k, const std::string& v) {
  std::uint64_t d = 0;
  const char* problem = "";
  if (!e.is_list) {
    d = want_uint(e, k, v);
  } else if (!config_syntax::parse_uint(v, d, problem)) {
    fail(fmt::format("{}: the division count '{}' {}; expected {}, e.g. {}", e.shown(), v, problem, k.forms,
                     k.example));
  }
  if (d != 0 && !config_syntax::is_pow2(d)) {
    if (!e.is_list) fail_value(e, k, "is not a power of 2 or 0");
    fail(fmt::format("{}: the division count {} is not a power of 2 or 0; expected {}, e.g. {}", e.shown(), v,
                     k.forms, k.example));
  }
  if (d > kMaxRoundupDivisions) {
    if (!e.is_list) fail_value(e, k, "is too large");
    fail(fmt::format("{}: the division count {} is too large (at most {}); expected {}, e.g. {}", e.shown(), v,
                     kMaxRoundupDivisions, k.forms, k.example));
  }
  return static_cast<std::uint32_t>(d);
}

void apply_roundup_power2_divisions(const Entry& e, const KeyInfo& k, Config& c) {
  auto& buckets = c.roundup_power2_divisions;
  if (!e.is_list) {
    buckets.fill(roundup_value(e, k, want_scalar(e, k)));
    return;
  }
  if (e.items.empty()) fail_value(e, k, "is an empty list");
  buckets.fill(0);
  bool any_boundary = false;
  std::size_t last_index = 0;
  for (std::size_t n = 0; n < e.items.size(); ++n) {
    const auto& [boundary, has_value, value] = e.items[n];
    if (!has_value)
      fail(fmt::format("{}: the item '{}' has no ':N'; expected {}, e.g. {}", e.shown(), boundary, k.forms,
                       k.example));
    std::uint32_t d = roundup_value(e, k, value);
    if (boundary == ">") {
      if (n + 1 != e.items.size())
        fail(fmt::format("{}: '>' must be the last item (it covers every bucket above the ones "
                         "listed); expected {}, e.g. {}",
                         e.shown(), k.forms, k.example));
      // PyTorch fills the buckets after the last one listed; alone, '>' covers them all.
      std::fill(buckets.begin() + (any_boundary ? last_index + 1 : 0), buckets.end(), d);
      break;
    }
    std::uint64_t mb = 0;
    const char* problem = "";
    if (!config_syntax::parse_uint(boundary, mb, problem))
      fail(fmt::format("{}: the boundary '{}' {}; expected {}, e.g. {}", e.shown(), boundary, problem, k.forms,
                       k.example));
    if (!config_syntax::is_pow2(mb) || mb > (1u << (kRoundupBuckets - 1)))
      fail(fmt::format("{}: the boundary {} is not a power of 2 between 1 and {} (MB); expected "
                       "{}, e.g. {}",
                       e.shown(), boundary, 1u << (kRoundupBuckets - 1), k.forms, k.example));
    std::size_t index = static_cast<std::size_t>(std::countr_zero(mb));
    if (any_boundary && index <= last_index)
      fail(fmt::format("{}: the boundary {} does not increase on the one before it; expected {}, "
                       "e.g. {}",
                       e.shown(), boundary, k.forms, k.example));
    // As in PyTorch, the first boundary's value also covers every bucket below it.
    if (!any_boundary) std::fill(buckets.begin(), buckets.begin() + index, d);
    buckets[index] = d;
    any_boundary = true;
    last_index = index;
  }
}

void apply_garbage_collection_threshold(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v == 0.0 || (v > 0.0 && v < 1.0))) fail_value(e, k, "is out of range");
  c.garbage_collection_threshold = v;
}

void apply_per_process_memory_fraction(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v <= 1.0)) fail_value(e, k, "is out of range");
  c.per_process_memory_fraction = v;
}

void apply_memory_limit(const Entry& e, const KeyInfo& k, Config& c) { c.memory_limit_bytes = want_mib(e, k); }

void apply_small_piece_size(const Entry& e, const KeyInfo& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  if (mib == 0 || mib % 2 != 0) fail_value(e, k, "is not a positive multiple of 2");
  c.small_piece_bytes = config_syntax::mib_to_bytes(e, k, mib);
}

void apply_pieces(const Entry& e, const KeyInfo& k, Config& c) {
  const std::string v = want_scalar(e, k);
  if (v == "adaptive") {
    c.pieces = PieceSizing::adaptive;
  } else if (v == "fixed") {
    c.pieces = PieceSizing::fixed;
  } else {
    fail_value(e, k, "is not a piece sizing");
  }
}

void apply_max_piece_size(const Entry& e, const KeyInfo& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  if (mib == 0 || mib % 2 != 0) fail_value(e, k, "is not a positive multiple of 2");
  c.max_piece_bytes = config_syntax::mib_to_bytes(e, k, mib);
}

void apply_frontier_piece_size(const Entry& e, const KeyInfo& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  if (mib % 2 != 0) fail_value(e, k, "is not a multiple of 2 (0 turns it off)");
  c.frontier_piece_bytes = config_syntax::mib_to_bytes(e, k, mib);
}

void apply_short_pieces_below(const Entry& e, const KeyInfo& k, Config& c) {
  c.short_pieces_below_bytes = config_syntax::mib_to_bytes(e, k, want_uint(e, k));
}

void apply_footprint_pieces(const Entry& e, const KeyInfo& k, Config& c) {
  c.footprint_pieces = static_cast<std::size_t>(want_uint(e, k));
}

void apply_recycle(const Entry& e, const KeyInfo& k, Config& c) { c.recycle = want_bool(e, k); }

void apply_recycle_budget(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v <= 1.0)) fail_value(e, k, "is out of range");
  c.recycle_budget = v;
}

void apply_recycle_burst(const Entry& e, const KeyInfo& k, Config& c) {
  std::uint64_t ms = want_uint(e, k);
  if (ms > 3'600'000) fail_value(e, k, "is more than an hour");
  c.recycle_burst_ms = static_cast<std::size_t>(ms);
}

void apply_recycle_slack(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v <= 1.0)) fail_value(e, k, "is out of range");
  c.recycle_slack = v;
}

void apply_recycle_ceiling(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v < 1.0)) fail_value(e, k, "is out of range");
  c.recycle_ceiling = v;
}

void apply_recycle_churn(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v < 1.0)) fail_value(e, k, "is out of range");
  c.recycle_churn = v;
}

void apply_recycle_headroom(const Entry& e, const KeyInfo& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v < 1.0)) fail_value(e, k, "is out of range");
  c.recycle_headroom = v;
}

void apply_recycle_keep_mappings(const Entry& e, const KeyInfo& k, Config& c) {
  c.recycle_keep_mappings = want_bool(e, k);
}

void apply_recycle_wait(const Entry& e, const KeyInfo& k, Config& c) {
  const std::string v = want_scalar(e, k);
  if (v == "fence") {
    c.recycle_wait = RecycleWait::fence;
  } else if (v == "sync") {
    c.recycle_wait = RecycleWait::sync;
  } else {
    fail_value(e, k, "is not a way to wait");
  }
}

void apply_recycle_overhang(const Entry& e, const KeyInfo& k, Config& c) { c.recycle_overhang = want_bool(e, k); }

void apply_thread_cache(const Entry& e, const KeyInfo& k, Config& c) { c.thread_cache = want_bool(e, k); }

void apply_arenas(const Entry& e, const KeyInfo& k, Config& c) {
  if (want_scalar(e, k) == "auto") {
    c.arenas = kArenasAuto;
    return;
  }
  const std::uint64_t n = want_uint(e, k);
  if (n < 1 || n > kMaxArenas) fail_value(e, k, "is not auto or a whole number from 1 to 64");
  c.arenas = static_cast<unsigned>(n);
}

void apply_step_plan(const Entry& e, const KeyInfo& k, Config& c) { c.step_plan = want_bool(e, k); }

void apply_va_reserve(const Entry& e, const KeyInfo& k, Config& c) {
  c.va_reserve_bytes = want_mib(e, k);  // checked against the pieces in check_config
}

void apply_check_invariants(const Entry& e, const KeyInfo& k, Config& c) { c.check_invariants = want_bool(e, k); }

// Checks that involve several keys, once every key is applied.
void check_config(const Config& c) {
  if (c.va_reserve_bytes != 0) {
    std::size_t piece = std::max(c.large_segment_size_bytes, c.small_piece_bytes);
    if (c.va_reserve_bytes < piece)
      fail(fmt::format("va_reserve_mb:{} cannot hold one piece ({} MiB, the larger of "
                       "large_segment_size_mb and small_piece_size_mb); expected 0 (automatic) or "
                       "a whole number of MiB >= {}, e.g. va_reserve_mb:262144",
                       c.va_reserve_bytes / kMiB, piece / kMiB, piece / kMiB));
  }
}

// The key table, in to_string's order: PyTorch's keys, then gpumem's.
constexpr Key<Config> kKeys[] = {
    {{"large_segment_size_mb", "", "a whole number of MiB > 10", "large_segment_size_mb:20", /*apply_first=*/true},
     apply_large_segment_size},
    {{"expandable_segments", "", "True or False", "expandable_segments:True"}, apply_expandable_segments},
    {{"max_split_size_mb", "", "a whole number of MiB >= large_segment_size_mb (20 by default), or unlimited",
      "max_split_size_mb:512"},
     apply_max_split_size},
    {{"max_non_split_rounding_mb", "", "a whole number of MiB >= large_segment_size_mb (20 by default)",
      "max_non_split_rounding_mb:64"},
     apply_max_non_split_rounding},
    {{"roundup_power2_divisions", "",
      "N, or a list [MB:N,...,>:N] of increasing power-of-2 MB boundaries (1 to 32768), where "
      "each N is a power of 2 or 0 (off)",
      "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]"},
     apply_roundup_power2_divisions},
    {{"garbage_collection_threshold", "", "a number in (0, 1), or 0 for off", "garbage_collection_threshold:0.8"},
     apply_garbage_collection_threshold},
    {{"per_process_memory_fraction", "", "a number in [0, 1]", "per_process_memory_fraction:0.9"},
     apply_per_process_memory_fraction},
    {{"memory_limit_mb", "", "a whole number of MiB (0 = no limit)", "memory_limit_mb:40960"}, apply_memory_limit},
    {{"small_piece_size_mb", "", "a positive multiple of 2 MiB (the CUDA mapping granularity)",
      "small_piece_size_mb:2"},
     apply_small_piece_size},
    {{"pieces", "", "adaptive or fixed", "pieces:adaptive"}, apply_pieces},
    {{"max_piece_size_mb", "", "a positive multiple of 2 MiB: the longest adaptive piece of the large pool",
      "max_piece_size_mb:8"},
     apply_max_piece_size},
    {{"frontier_piece_size_mb", "",
      "0 (off) or a multiple of 2 MiB: the longest piece a growth at a region's end creates when it moves none",
      "frontier_piece_size_mb:32"},
     apply_frontier_piece_size},
    {{"short_pieces_below_mb", "",
      "a whole number of MiB (0 = off): below this footprint the large pool's pieces are one slot long",
      "short_pieces_below_mb:4096"},
     apply_short_pieces_below},
    {{"footprint_pieces", "",
      "a whole number (0 = off): no large-pool piece is longer than the footprint divided by it (at least 2 MiB)",
      "footprint_pieces:512"},
     apply_footprint_pieces},
    {{"recycle", "", "True or False", "recycle:True"}, apply_recycle},
    {{"recycle_budget", "", "a number in [0, 1]: the share of time recycling may spend (0 = none: the memory guard decides "
      "every growth; 1 = no budget)",
      "recycle_budget:0.005"},
     apply_recycle_budget},
    {{"recycle_burst_ms", "", "a whole number of milliseconds (at most 3600000)", "recycle_burst_ms:10"},
     apply_recycle_burst},
    {{"recycle_slack", "", "a number in [0, 1]: memory the recycle budget may add, as a share of the footprint",
      "recycle_slack:0.05"},
     apply_recycle_slack},
    {{"recycle_ceiling", "",
      "a number in [0, 1): the recycle budget buys memory only while the footprint stays within 1 + this x "
      "the most memory in use (0 = no such bound)",
      "recycle_ceiling:0.015"},
     apply_recycle_ceiling},
    {{"recycle_churn", "",
      "a number in [0, 1): while recycling's driver calls take this share of the recent time, the memory guard may "
      "buy 10 points more (0 = off)",
      "recycle_churn:0.2"},
     apply_recycle_churn},
    {{"recycle_headroom", "",
      "a number in [0, 1): create instead of recycling while the footprint stays within 1 + this x the most "
      "memory in use (0 = off)",
      "recycle_headroom:0.008"},
     apply_recycle_headroom},
    {{"recycle_keep_mappings", "", "True or False", "recycle_keep_mappings:True"}, apply_recycle_keep_mappings},
    {{"recycle_wait", "",
      "fence (a piece moves only once fence events show its memory idle; no stream synchronization below the cap) "
      "or sync (synchronize the piece's stream)",
      "recycle_wait:fence"},
     apply_recycle_wait},
    {{"recycle_overhang", "", "True or False", "recycle_overhang:True"}, apply_recycle_overhang},
    {{"thread_cache", "", "True or False", "thread_cache:True"}, apply_thread_cache},
    {{"arenas", "", "auto or a whole number from 1 to 64: engines per device (1 = one engine for every thread)",
      "arenas:4"},
     apply_arenas},
    {{"step_plan", "", "True or False", "step_plan:True"}, apply_step_plan},
    {{"va_reserve_mb", "",
      "0 (1.125 x device memory) or a whole number of MiB >= large_segment_size_mb and "
      ">= small_piece_size_mb",
      "va_reserve_mb:262144"},
     apply_va_reserve},
    {{"check_invariants", "", "True or False", "check_invariants:False"}, apply_check_invariants},
};

}  // namespace

config_syntax::KeyTable config_key_table(Config& target) { return config_syntax::KeyTable(kKeys, target, check_config); }

std::variant<Config, ConfigError> parse_config(std::string_view text) {
  Config c;
  const config_syntax::KeyTable tables[] = {config_key_table(c)};
  if (auto error = config_syntax::parse_config_text(text, config_syntax::error_prefix(""), tables)) return *error;
  return c;
}

std::string to_string(const Config& c) {
  using config_syntax::bool_text;
  fmt::memory_buffer out;
  auto put = [&out](std::string_view key, auto&& value) {
    if (out.size() != 0) out.push_back(',');
    fmt::format_to(std::back_inserter(out), "{}:{}", key, value);
  };
  auto mib = [](std::size_t bytes) { return bytes / kMiB; };  // sizes are whole MiB when parsed

  put("large_segment_size_mb", mib(c.large_segment_size_bytes));
  put("expandable_segments", bool_text(c.expandable_segments));
  if (c.max_split_size_bytes == kNoLimit)
    put("max_split_size_mb", "unlimited");
  else
    put("max_split_size_mb", mib(c.max_split_size_bytes));
  put("max_non_split_rounding_mb", mib(c.max_non_split_rounding_bytes));
  const auto& r = c.roundup_power2_divisions;
  if (std::all_of(r.begin(), r.end(), [&](std::uint32_t d) { return d == r[0]; })) {
    put("roundup_power2_divisions", r[0]);
  } else {
    std::string list = "[";
    for (std::size_t i = 0; i < r.size(); ++i) list += fmt::format("{}{}:{}", i ? "," : "", std::size_t{1} << i, r[i]);
    put("roundup_power2_divisions", list + "]");
  }
  put("garbage_collection_threshold", c.garbage_collection_threshold);
  put("per_process_memory_fraction", c.per_process_memory_fraction);
  put("memory_limit_mb", mib(c.memory_limit_bytes));
  put("small_piece_size_mb", mib(c.small_piece_bytes));
  put("pieces", c.pieces == PieceSizing::fixed ? "fixed" : "adaptive");
  put("max_piece_size_mb", mib(c.max_piece_bytes));
  put("frontier_piece_size_mb", mib(c.frontier_piece_bytes));
  put("short_pieces_below_mb", mib(c.short_pieces_below_bytes));
  put("footprint_pieces", c.footprint_pieces);
  put("recycle", bool_text(c.recycle));
  put("recycle_budget", c.recycle_budget);
  put("recycle_burst_ms", c.recycle_burst_ms);
  put("recycle_slack", c.recycle_slack);
  put("recycle_ceiling", c.recycle_ceiling);
  put("recycle_churn", c.recycle_churn);
  put("recycle_headroom", c.recycle_headroom);
  put("recycle_keep_mappings", bool_text(c.recycle_keep_mappings));
  put("recycle_wait", c.recycle_wait == RecycleWait::sync ? "sync" : "fence");
  put("recycle_overhang", bool_text(c.recycle_overhang));
  put("thread_cache", bool_text(c.thread_cache));
  if (c.arenas == kArenasAuto)
    put("arenas", "auto");
  else
    put("arenas", c.arenas);
  put("step_plan", bool_text(c.step_plan));
  put("va_reserve_mb", mib(c.va_reserve_bytes));
  put("check_invariants", bool_text(c.check_invariants));
  return fmt::to_string(out);
}

std::vector<std::string_view> config_keys() {
  Config unused;
  const config_syntax::KeyTable tables[] = {config_key_table(unused)};
  return config_syntax::key_names(tables);
}

}  // namespace gpumem::alloc
