// Config parsing: PYTORCH_CUDA_ALLOC_CONF's syntax, PyTorch 2.11's keys with PyTorch's meaning,
// plus gpumem's own keys. docs/config.md documents every key; keep the key table below and that
// page in step (tests/allocator/test_config.cpp checks that the page names every key).
//
// Parsing runs in three steps:
//   1. tokenize: ',' ':' '[' ']' separate tokens; white space is dropped (PyTorch does the same),
//      except inside oom_report_dir's value, where only the ends are trimmed;
//   2. group the tokens into entries: key ':' value, where value is one token, a list
//      '[' a:b, c:d ']' (roundup_power2_divisions), or nothing (oom_report_dir only);
//   3. apply the entries to a Config: large_segment_size_mb first, because max_split_size_mb and
//      max_non_split_rounding_mb are checked against it (PyTorch parses it first too), then the
//      others in the order written, then the checks that involve several keys.
// Every failure is one message naming the key, the bad value and the accepted forms. Inside this
// file a failure travels as a ConfigFailure exception; parse_config turns it into a ConfigError.
//
// Where gpumem is looser than PyTorch (it accepts a few spellings PyTorch rejects, so that
// to_string can spell every setting): garbage_collection_threshold:0, roundup_power2_divisions:0,
// pinned_reserve_segment_size_mb:0 and max_split_size_mb:unlimited all mean "off" (the default).
// Where it is stricter: numbers must be plain decimal digits ("12abc" is rejected, PyTorch reads
// 12), keys may not repeat (PyTorch keeps the last), and roundup_power2_divisions lists must give
// increasing boundaries of at most 32768 MB with '>' last.
#include "gpumem/alloc/config.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdlib>
#include <iterator>
#include <utility>

#include <fmt/format.h>

namespace gpumem::alloc {
namespace {

struct ConfigFailure {
  std::string message;  // without the "gpumem config: " prefix
};

[[noreturn]] void fail(std::string message) { throw ConfigFailure{std::move(message)}; }

// ---- step 1: tokens ----

enum class TokenKind : std::uint8_t { word, colon, comma, open, close };

struct Token {
  TokenKind kind = TokenKind::word;
  std::string text;  // words: white space removed
  std::string raw;   // words: only the ends trimmed
};

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::vector<Token> tokenize(std::string_view text) {
  std::vector<Token> tokens;
  std::string word;
  auto flush = [&] {
    std::size_t b = 0, e = word.size();
    while (b < e && is_space(word[b])) ++b;
    while (e > b && is_space(word[e - 1])) --e;
    if (b == e) {
      word.clear();
      return;
    }
    Token t;
    t.raw = word.substr(b, e - b);
    for (char c : t.raw)
      if (!is_space(c)) t.text += c;
    tokens.push_back(std::move(t));
    word.clear();
  };
  for (char c : text) {
    TokenKind kind;
    switch (c) {
      case ':': kind = TokenKind::colon; break;
      case ',': kind = TokenKind::comma; break;
      case '[': kind = TokenKind::open; break;
      case ']': kind = TokenKind::close; break;
      default: word += c; continue;
    }
    flush();
    tokens.push_back(Token{kind, std::string(1, c), std::string(1, c)});
  }
  flush();
  return tokens;
}

// ---- step 2: entries ----

struct Entry {
  std::string key;        // as written (white space removed)
  bool is_list = false;   // value was [ ... ]
  std::string value;      // scalar value, white space removed ("" = no value)
  std::string raw_value;  // scalar value, ends trimmed
  struct Item {
    std::string first;   // a
    bool has_second = false;
    std::string second;  // b, when the item is a:b
  };
  std::vector<Item> items;  // list items: a:b or a
  std::string list_text;  // the list as written, for messages: [a:b,c:d]

  // key:value as the user wrote it (for messages).
  std::string shown() const { return key + ":" + (is_list ? list_text : value); }
};

struct KeySpec {
  std::string_view name;
  std::string_view alias;    // another accepted spelling (PyTorch's ROCm names), or empty
  std::string_view forms;    // the accepted values, in words
  std::string_view example;  // one valid entry
  void (*apply)(const Entry&, const KeySpec&, Config&);
};

const KeySpec* find_key(std::string_view name);
std::string accepted_keys_text();

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0u : 1u)});
      diag = up;
    }
  }
  return row[b.size()];
}

[[noreturn]] void fail_unknown_key(std::string_view key) {
  std::string hint;
  std::size_t best = 4;  // suggest only close misspellings
  for (std::string_view k : config_keys()) {
    std::size_t d = edit_distance(key, k);
    if (d < best) {
      best = d;
      hint = fmt::format(" did you mean '{}'?", k);
    }
  }
  fail(fmt::format("unknown key '{}';{} accepted keys: {}", key, hint, accepted_keys_text()));
}

std::string describe(const Token& t) { return "'" + t.text + "'"; }

std::vector<Entry> group_entries(const std::vector<Token>& t) {
  std::vector<Entry> entries;
  std::size_t i = 0;
  const std::size_t n = t.size();
  while (i < n) {
    if (t[i].kind != TokenKind::word) {
      if (t[i].kind == TokenKind::comma)
        fail("an empty entry (a leading ',' or two ',' in a row); entries look like "
             "key:value,key2:value2");
      fail(fmt::format("found {} where a key was expected; entries look like "
                       "key:value,key2:[a:b,c:d]",
                       describe(t[i])));
    }
    Entry e;
    e.key = t[i].text;
    const KeySpec* spec = find_key(e.key);
    if (!spec) fail_unknown_key(e.key);
    ++i;
    if (i >= n || t[i].kind != TokenKind::colon)
      fail(fmt::format("{} has no ':' and no value; expected {}, e.g. {}", e.key, spec->forms,
                       spec->example));
    ++i;
    if (i < n && t[i].kind == TokenKind::open) {
      e.is_list = true;
      e.list_text.push_back('[');  // (push_back: g++ 12 warns falsely on = "[")
      ++i;
      bool closed = false;
      while (i < n) {
        if (t[i].kind == TokenKind::close) {
          closed = true;
          ++i;
          break;
        }
        if (t[i].kind != TokenKind::word)
          fail(fmt::format("{}:{}... is malformed at {}; expected {}, e.g. {}", e.key, e.list_text,
                           describe(t[i]), spec->forms, spec->example));
        Entry::Item item;
        item.first = t[i].text;
        e.list_text += t[i].text;
        ++i;
        if (i < n && t[i].kind == TokenKind::colon) {
          if (i + 1 >= n || t[i + 1].kind != TokenKind::word)
            fail(fmt::format("{}:{}:... is malformed at {}; list items look like a:b, so expected "
                             "{}, e.g. {}",
                             e.key, e.list_text, i + 1 < n ? describe(t[i + 1]) : "the end",
                             spec->forms, spec->example));
          item.has_second = true;
          item.second = t[i + 1].text;
          e.list_text += ":" + item.second;
          i += 2;
        }
        e.items.push_back(std::move(item));
        if (i < n && t[i].kind == TokenKind::comma) {
          e.list_text += ",";
          ++i;
        } else if (i < n && t[i].kind != TokenKind::close) {
          fail(fmt::format("{}:{}... is malformed at {}; separate list items with ',', e.g. {}",
                           e.key, e.list_text, describe(t[i]), spec->example));
        }
      }
      if (!closed)
        fail(fmt::format("the '[' after {}: is never closed; lists look like {}", e.key,
                         spec->example));
      e.list_text += "]";
    } else if (i < n && t[i].kind == TokenKind::word) {
      e.value = t[i].text;
      e.raw_value = t[i].raw;
      ++i;
    }
    // else: no value; the key's handler decides whether that is allowed.
    if (i < n) {
      if (t[i].kind != TokenKind::comma)
        fail(fmt::format("unexpected {} after {}; separate entries with ',' (values cannot contain "
                         "':', ',', '[' or ']')",
                         describe(t[i]), e.shown()));
      ++i;  // a trailing ',' at the very end is accepted, as PyTorch does
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

// ---- step 3: values ----

[[noreturn]] void fail_value(const Entry& e, const KeySpec& k, std::string_view problem) {
  if (!e.is_list && e.value.empty())
    fail(fmt::format("{} has no value; expected {}, e.g. {}", e.key, k.forms, k.example));
  fail(fmt::format("{} {}; expected {}, e.g. {}", e.shown(), problem, k.forms, k.example));
}

const std::string& scalar(const Entry& e, const KeySpec& k) {
  if (e.is_list) fail_value(e, k, "is a list, but this key takes a single value");
  if (e.value.empty()) fail_value(e, k, "");
  return e.value;
}

bool want_bool(const Entry& e, const KeySpec& k) {
  const std::string& v = scalar(e, k);
  if (v == "True") return true;
  if (v == "False") return false;
  std::string lower = v;
  for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (lower == "true" || lower == "false" || lower == "1" || lower == "0")
    fail_value(e, k, "is not accepted (booleans are exactly True or False)");
  fail_value(e, k, "is not a boolean");
}

// A non-negative decimal integer: digits only, no sign, no suffix. On failure returns false and
// sets problem to "is negative", "is too large" or "is not a whole number".
bool parse_uint(std::string_view v, std::uint64_t& out, const char*& problem) {
  if (!v.empty() && v[0] == '-') {
    problem = "is negative";
    return false;
  }
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out, 10);
  if (ec == std::errc::result_out_of_range) {
    problem = "is too large";
    return false;
  }
  if (v.empty() || ec != std::errc() || end != v.data() + v.size()) {
    problem = "is not a whole number";
    return false;
  }
  return true;
}

std::uint64_t want_uint(const Entry& e, const KeySpec& k, const std::string& v) {
  std::uint64_t out = 0;
  const char* problem = "";
  if (!parse_uint(v, out, problem)) fail_value(e, k, problem);
  return out;
}

std::uint64_t want_uint(const Entry& e, const KeySpec& k) { return want_uint(e, k, scalar(e, k)); }

double want_number(const Entry& e, const KeySpec& k) {
  const std::string& v = scalar(e, k);
  double out = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out, std::chars_format::general);
  if (ec == std::errc::result_out_of_range) fail_value(e, k, "is out of range");
  if (ec != std::errc() || end != v.data() + v.size()) fail_value(e, k, "is not a number");
  return out;
}

std::size_t mib_to_bytes(const Entry& e, const KeySpec& k, std::uint64_t mib) {
  if (mib > kNoLimit / kMiB) fail_value(e, k, "is too large (the size in bytes does not fit in 64 bits)");
  return static_cast<std::size_t>(mib) * kMiB;
}

bool is_pow2(std::uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

// ---- step 3: one handler per key ----

constexpr std::uint64_t kLargeSegmentMinMiB = 10;            // PyTorch: must be > kMinLargeAlloc
constexpr std::uint64_t kMaxRoundupDivisions = 1ull << 31;   // fits the uint32 buckets
constexpr std::uint64_t kMaxRegisterThreads = 128;           // PyTorch's limit
constexpr std::uint64_t kMaxTraceEntries = 1ull << 30;
constexpr std::size_t kRoundupBuckets = 16;                  // [1 MiB, 2 MiB) ... [32 GiB, inf)

void apply_expandable_segments(const Entry& e, const KeySpec& k, Config& c) {
  c.expandable_segments = want_bool(e, k);
}

void apply_large_segment_size(const Entry& e, const KeySpec& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  if (mib <= kLargeSegmentMinMiB) fail_value(e, k, "is too small");
  c.large_segment_size_bytes = mib_to_bytes(e, k, mib);
}

void apply_max_split_size(const Entry& e, const KeySpec& k, Config& c) {
  if (scalar(e, k) == "unlimited") {
    c.max_split_size_bytes = kNoLimit;
    return;
  }
  std::uint64_t mib = want_uint(e, k);
  std::size_t bytes = mib_to_bytes(e, k, mib);
  if (bytes < c.large_segment_size_bytes)
    fail(fmt::format("{} is smaller than the large segment size ({} MiB); expected a whole number "
                     "of MiB >= {} (large_segment_size_mb) or unlimited, e.g. {}",
                     e.shown(), c.large_segment_size_bytes / kMiB, c.large_segment_size_bytes / kMiB,
                     k.example));
  c.max_split_size_bytes = bytes;
}

void apply_max_non_split_rounding(const Entry& e, const KeySpec& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  std::size_t bytes = mib_to_bytes(e, k, mib);
  if (bytes < c.large_segment_size_bytes)
    fail(fmt::format("{} is smaller than the large segment size ({} MiB); expected a whole number "
                     "of MiB >= {} (large_segment_size_mb), e.g. {}",
                     e.shown(), c.large_segment_size_bytes / kMiB, c.large_segment_size_bytes / kMiB,
                     k.example));
  c.max_non_split_rounding_bytes = bytes;
}

// One division count of roundup_power2_divisions (the scalar form or a list item's value).
std::uint32_t roundup_value(const Entry& e, const KeySpec& k, const std::string& v) {
  std::uint64_t d = 0;
  const char* problem = "";
  if (!e.is_list) {
    d = want_uint(e, k, v);
  } else if (!parse_uint(v, d, problem)) {
    fail(fmt::format("{}: the division count '{}' {}; expected {}, e.g. {}", e.shown(), v,
                     problem, k.forms, k.example));
  }
  if (d != 0 && !is_pow2(d)) {
    if (!e.is_list) fail_value(e, k, "is not a power of 2 or 0");
    fail(fmt::format("{}: the division count {} is not a power of 2 or 0; expected {}, e.g. {}",
                     e.shown(), v, k.forms, k.example));
  }
  if (d > kMaxRoundupDivisions) {
    if (!e.is_list) fail_value(e, k, "is too large");
    fail(fmt::format("{}: the division count {} is too large (at most {}); expected {}, e.g. {}",
                     e.shown(), v, kMaxRoundupDivisions, k.forms, k.example));
  }
  return static_cast<std::uint32_t>(d);
}

void apply_roundup_power2_divisions(const Entry& e, const KeySpec& k, Config& c) {
  auto& buckets = c.roundup_power2_divisions;
  if (!e.is_list) {
    buckets.fill(roundup_value(e, k, scalar(e, k)));
    return;
  }
  if (e.items.empty()) fail_value(e, k, "is an empty list");
  buckets.fill(0);
  bool any_boundary = false;
  std::size_t last_index = 0;
  for (std::size_t n = 0; n < e.items.size(); ++n) {
    const auto& [boundary, has_value, value] = e.items[n];
    if (!has_value)
      fail(fmt::format("{}: the item '{}' has no ':N'; expected {}, e.g. {}", e.shown(), boundary,
                       k.forms, k.example));
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
    if (!parse_uint(boundary, mb, problem))
      fail(fmt::format("{}: the boundary '{}' {}; expected {}, e.g. {}", e.shown(), boundary,
                       problem, k.forms, k.example));
    if (!is_pow2(mb) || mb > (1u << (kRoundupBuckets - 1)))
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

void apply_garbage_collection_threshold(const Entry& e, const KeySpec& k, Config& c) {
  double v = want_number(e, k);
  if (!(v == 0.0 || (v > 0.0 && v < 1.0))) fail_value(e, k, "is out of range");
  c.garbage_collection_threshold = v;
}

void apply_per_process_memory_fraction(const Entry& e, const KeySpec& k, Config& c) {
  double v = want_number(e, k);
  if (!(v >= 0.0 && v <= 1.0)) fail_value(e, k, "is out of range");
  c.per_process_memory_fraction = v;
}

void apply_backend(const Entry& e, const KeySpec& k, Config&) {
  const std::string& v = scalar(e, k);
  if (v == "native") return;  // PyTorch's default allocator: gpumem stands in for it
  if (v == "cudaMallocAsync")
    fail(fmt::format("{} selects PyTorch's cudaMallocAsync allocator, but gpumem replaces "
                     "PyTorch's CUDA allocator; remove backend:cudaMallocAsync (or write "
                     "backend:native) to use gpumem, or do not load gpumem to use cudaMallocAsync",
                     e.shown()));
  fail_value(e, k, "is not a known backend");
}

void apply_release_lock_on_cudamalloc(const Entry& e, const KeySpec& k, Config& c) {
  c.release_lock_on_cudamalloc = want_bool(e, k);
}

void apply_pinned_use_cuda_host_register(const Entry& e, const KeySpec& k, Config& c) {
  c.pinned_use_cuda_host_register = want_bool(e, k);
}

void apply_pinned_num_register_threads(const Entry& e, const KeySpec& k, Config& c) {
  std::uint64_t v = want_uint(e, k);
  if (!is_pow2(v)) fail_value(e, k, "is not a power of 2");
  if (v > kMaxRegisterThreads) fail_value(e, k, "is too large");
  c.pinned_num_register_threads = static_cast<std::uint32_t>(v);
}

void apply_pinned_reserve_segment_size(const Entry& e, const KeySpec& k, Config& c) {
  c.pinned_reserve_segment_size_bytes = mib_to_bytes(e, k, want_uint(e, k));
}

void apply_pinned_use_background_threads(const Entry& e, const KeySpec& k, Config& c) {
  c.pinned_use_background_threads = want_bool(e, k);
}

void apply_graph_capture_record_stream_reuse(const Entry& e, const KeySpec& k, Config& c) {
  c.graph_capture_record_stream_reuse = want_bool(e, k);
}

void apply_source(const Entry& e, const KeySpec& k, Config& c) {
  const std::string& v = scalar(e, k);
  for (SourceKind s : {SourceKind::cuda_vmm, SourceKind::cuda_malloc, SourceKind::host_vmm,
                       SourceKind::sim}) {
    if (v == to_string(s)) {
      c.source = s;
      return;
    }
  }
  fail_value(e, k, "is not a known memory source");
}

void apply_memory_limit(const Entry& e, const KeySpec& k, Config& c) {
  c.memory_limit_bytes = mib_to_bytes(e, k, want_uint(e, k));
}

void apply_small_piece_size(const Entry& e, const KeySpec& k, Config& c) {
  std::uint64_t mib = want_uint(e, k);
  if (mib == 0 || mib % 2 != 0) fail_value(e, k, "is not a positive multiple of 2");
  c.small_piece_bytes = mib_to_bytes(e, k, mib);
}

void apply_recycle(const Entry& e, const KeySpec& k, Config& c) { c.recycle = want_bool(e, k); }

void apply_thread_cache(const Entry& e, const KeySpec& k, Config& c) {
  c.thread_cache = want_bool(e, k);
}

void apply_va_reserve(const Entry& e, const KeySpec& k, Config& c) {
  c.va_reserve_bytes = mib_to_bytes(e, k, want_uint(e, k));  // checked against the pieces later
}

void apply_check_invariants(const Entry& e, const KeySpec& k, Config& c) {
  c.check_invariants = want_bool(e, k);
}

void apply_trace_entries(const Entry& e, const KeySpec& k, Config& c) {
  std::uint64_t v = want_uint(e, k);
  if (v > kMaxTraceEntries) fail_value(e, k, "is too large");
  c.trace_entries = static_cast<std::size_t>(v);
}

void apply_oom_report_dir(const Entry& e, const KeySpec& k, Config& c) {
  if (e.is_list) fail_value(e, k, "is a list, but this key takes a single value");
  c.oom_report_dir = e.raw_value;  // empty = off
}

void apply_record_ops(const Entry& e, const KeySpec& k, Config& c) { c.record_ops = want_bool(e, k); }

// The key table, in to_string's order: PyTorch's keys, then gpumem's.
constexpr KeySpec kKeys[] = {
    {"large_segment_size_mb", "", "a whole number of MiB > 10", "large_segment_size_mb:20",
     apply_large_segment_size},
    {"expandable_segments", "", "True or False", "expandable_segments:True",
     apply_expandable_segments},
    {"max_split_size_mb", "",
     "a whole number of MiB >= large_segment_size_mb (20 by default), or unlimited",
     "max_split_size_mb:512", apply_max_split_size},
    {"max_non_split_rounding_mb", "",
     "a whole number of MiB >= large_segment_size_mb (20 by default)",
     "max_non_split_rounding_mb:64", apply_max_non_split_rounding},
    {"roundup_power2_divisions", "",
     "N, or a list [MB:N,...,>:N] of increasing power-of-2 MB boundaries (1 to 32768), where "
     "each N is a power of 2 or 0 (off)",
     "roundup_power2_divisions:[256:1,512:2,1024:4,>:8]", apply_roundup_power2_divisions},
    {"garbage_collection_threshold", "", "a number in (0, 1), or 0 for off",
     "garbage_collection_threshold:0.8", apply_garbage_collection_threshold},
    {"per_process_memory_fraction", "", "a number in [0, 1]", "per_process_memory_fraction:0.9",
     apply_per_process_memory_fraction},
    {"backend", "", "native (gpumem replaces PyTorch's allocators, so cudaMallocAsync is refused)",
     "backend:native", apply_backend},
    {"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "True or False",
     "release_lock_on_cudamalloc:False", apply_release_lock_on_cudamalloc},
    {"pinned_use_cuda_host_register", "pinned_use_hip_host_register", "True or False",
     "pinned_use_cuda_host_register:True", apply_pinned_use_cuda_host_register},
    {"pinned_num_register_threads", "", "a power of 2 from 1 to 128",
     "pinned_num_register_threads:8", apply_pinned_num_register_threads},
    {"pinned_reserve_segment_size_mb", "", "a whole number of MiB (0 = off)",
     "pinned_reserve_segment_size_mb:256", apply_pinned_reserve_segment_size},
    {"pinned_use_background_threads", "", "True or False", "pinned_use_background_threads:True",
     apply_pinned_use_background_threads},
    {"graph_capture_record_stream_reuse", "", "True or False",
     "graph_capture_record_stream_reuse:True", apply_graph_capture_record_stream_reuse},
    {"source", "", "cuda_vmm, cuda_malloc, host_vmm or sim", "source:cuda_vmm", apply_source},
    {"memory_limit_mb", "", "a whole number of MiB (0 = no limit)", "memory_limit_mb:40960",
     apply_memory_limit},
    {"small_piece_size_mb", "", "a positive multiple of 2 MiB (the CUDA mapping granularity)",
     "small_piece_size_mb:2", apply_small_piece_size},
    {"recycle", "", "True or False", "recycle:True", apply_recycle},
    {"thread_cache", "", "True or False", "thread_cache:True", apply_thread_cache},
    {"va_reserve_mb", "",
     "0 (1.125 x device memory) or a whole number of MiB >= large_segment_size_mb and "
     ">= small_piece_size_mb",
     "va_reserve_mb:262144", apply_va_reserve},
    {"check_invariants", "", "True or False", "check_invariants:False", apply_check_invariants},
    {"trace_entries", "", "a whole number from 0 (off) to 1073741824", "trace_entries:100000",
     apply_trace_entries},
    {"oom_report_dir", "",
     "a directory path without ',', ':', '[' or ']' (empty = off)", "oom_report_dir:/tmp/oom",
     apply_oom_report_dir},
    {"record_ops", "", "True or False", "record_ops:True", apply_record_ops},
};

const KeySpec* find_key(std::string_view name) {
  for (const KeySpec& k : kKeys)
    if (name == k.name || (!k.alias.empty() && name == k.alias)) return &k;
  return nullptr;
}

std::string accepted_keys_text() {
  std::string out;
  for (const KeySpec& k : kKeys) {
    if (!out.empty()) out += ", ";
    out += k.name;
  }
  return out;
}

Config parse_or_throw(std::string_view text) {
  std::vector<Entry> entries = group_entries(tokenize(text));

  // One entry per key (an alias counts as its key).
  std::vector<std::pair<const KeySpec*, const Entry*>> given;
  for (const Entry& e : entries) {
    const KeySpec* k = find_key(e.key);
    for (const auto& [seen_key, seen_entry] : given)
      if (seen_key == k)
        fail(fmt::format("{} is given twice ({} and {}); give each key once", k->name,
                         seen_entry->shown(), e.shown()));
    given.emplace_back(k, &e);
  }

  Config c;
  c.source_string = std::string(text);
  for (const auto& [k, e] : given)
    if (k->apply == apply_large_segment_size) k->apply(*e, *k, c);
  c.max_non_split_rounding_bytes = c.large_segment_size_bytes;  // PyTorch's default
  for (const auto& [k, e] : given)
    if (k->apply != apply_large_segment_size) k->apply(*e, *k, c);

  if (c.va_reserve_bytes != 0) {
    std::size_t piece = std::max(c.large_segment_size_bytes, c.small_piece_bytes);
    if (c.va_reserve_bytes < piece)
      fail(fmt::format("va_reserve_mb:{} cannot hold one piece ({} MiB, the larger of "
                       "large_segment_size_mb and small_piece_size_mb); expected 0 (automatic) or "
                       "a whole number of MiB >= {}, e.g. va_reserve_mb:262144",
                       c.va_reserve_bytes / kMiB, piece / kMiB, piece / kMiB));
  }
  return c;
}

std::variant<Config, ConfigError> parse_with_prefix(std::string_view text, std::string_view prefix) {
  try {
    return parse_or_throw(text);
  } catch (const ConfigFailure& f) {
    return ConfigError{fmt::format("{}{}", prefix, f.message)};
  }
}

const char* bool_text(bool v) { return v ? "True" : "False"; }

}  // namespace

std::size_t Config::cap_bytes(std::size_t device_total_bytes) const noexcept {
  std::size_t cap = kNoLimit;
  if (per_process_memory_fraction < 1.0 && device_total_bytes != 0) {
    double bytes = per_process_memory_fraction * static_cast<double>(device_total_bytes);
    if (bytes < 18446744073709551616.0) cap = static_cast<std::size_t>(bytes);  // 2^64
  }
  if (memory_limit_bytes != 0) cap = std::min(cap, memory_limit_bytes);
  return cap;
}

bool operator==(const Config& a, const Config& b) noexcept {
  return a.expandable_segments == b.expandable_segments &&
         a.max_split_size_bytes == b.max_split_size_bytes &&
         a.max_non_split_rounding_bytes == b.max_non_split_rounding_bytes &&
         a.large_segment_size_bytes == b.large_segment_size_bytes &&
         a.roundup_power2_divisions == b.roundup_power2_divisions &&
         a.garbage_collection_threshold == b.garbage_collection_threshold &&
         a.per_process_memory_fraction == b.per_process_memory_fraction &&
         a.release_lock_on_cudamalloc == b.release_lock_on_cudamalloc &&
         a.pinned_use_cuda_host_register == b.pinned_use_cuda_host_register &&
         a.pinned_num_register_threads == b.pinned_num_register_threads &&
         a.pinned_reserve_segment_size_bytes == b.pinned_reserve_segment_size_bytes &&
         a.pinned_use_background_threads == b.pinned_use_background_threads &&
         a.graph_capture_record_stream_reuse == b.graph_capture_record_stream_reuse &&
         a.source == b.source && a.memory_limit_bytes == b.memory_limit_bytes &&
         a.small_piece_bytes == b.small_piece_bytes && a.recycle == b.recycle &&
         a.thread_cache == b.thread_cache && a.va_reserve_bytes == b.va_reserve_bytes &&
         a.check_invariants == b.check_invariants && a.trace_entries == b.trace_entries &&
         a.oom_report_dir == b.oom_report_dir && a.record_ops == b.record_ops;
}

std::variant<Config, ConfigError> parse_config(std::string_view text) {
  return parse_with_prefix(text, "gpumem config: ");
}

std::variant<Config, ConfigError> config_from_environment() {
  for (const char* var : {"GPUMEM_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"}) {
    if (const char* value = std::getenv(var))
      return parse_with_prefix(value, fmt::format("gpumem config (from {}): ", var));
  }
  return Config{};
}

std::string to_string(const Config& c) {
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
    for (std::size_t i = 0; i < r.size(); ++i)
      list += fmt::format("{}{}:{}", i ? "," : "", std::size_t{1} << i, r[i]);
    put("roundup_power2_divisions", list + "]");
  }
  put("garbage_collection_threshold", c.garbage_collection_threshold);
  put("per_process_memory_fraction", c.per_process_memory_fraction);
  put("release_lock_on_cudamalloc", bool_text(c.release_lock_on_cudamalloc));
  put("pinned_use_cuda_host_register", bool_text(c.pinned_use_cuda_host_register));
  put("pinned_num_register_threads", c.pinned_num_register_threads);
  put("pinned_reserve_segment_size_mb", mib(c.pinned_reserve_segment_size_bytes));
  put("pinned_use_background_threads", bool_text(c.pinned_use_background_threads));
  put("graph_capture_record_stream_reuse", bool_text(c.graph_capture_record_stream_reuse));
  put("source", to_string(c.source));
  put("memory_limit_mb", mib(c.memory_limit_bytes));
  put("small_piece_size_mb", mib(c.small_piece_bytes));
  put("recycle", bool_text(c.recycle));
  put("thread_cache", bool_text(c.thread_cache));
  put("va_reserve_mb", mib(c.va_reserve_bytes));
  put("check_invariants", bool_text(c.check_invariants));
  put("trace_entries", c.trace_entries);
  put("oom_report_dir", c.oom_report_dir);
  put("record_ops", bool_text(c.record_ops));
  return fmt::to_string(out);
}

const char* to_string(SourceKind kind) noexcept {
  switch (kind) {
    case SourceKind::cuda_vmm: return "cuda_vmm";
    case SourceKind::cuda_malloc: return "cuda_malloc";
    case SourceKind::host_vmm: return "host_vmm";
    case SourceKind::sim: return "sim";
  }
  return "unknown";
}

std::vector<std::string_view> config_keys() {
  std::vector<std::string_view> keys;
  for (const KeySpec& k : kKeys) keys.push_back(k.name);
  for (const KeySpec& k : kKeys)
    if (!k.alias.empty()) keys.push_back(k.alias);
  return keys;
}

}  // namespace gpumem::alloc
