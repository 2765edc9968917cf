// The engine's configuration (alloc::Config): the syntax every layer shares, every engine key, every
// kind of bad input, the canonical string. The keys of the other layers, the environment and the
// documentation of every key are tested with the parse that joins them all, in
// tests/torch/test_config.cpp.
#include <algorithm>
#include <string>
#include <vector>

#include "catch.h"
#include "config_test_support.h"
#include "engine_config_cases.h"
#include "gpumem/alloc/config.h"

using namespace gpumem::alloc;

namespace {

Config parse_ok(const std::string& text) { return gpumem::testing::parse_ok<Config, ConfigError>(parse_config, text); }

void check_error(const std::string& text, const std::vector<std::string>& must_contain) {
  gpumem::testing::check_error<Config, ConfigError>(parse_config, text, must_contain);
}

}  // namespace

TEST_CASE("config: empty and blank strings give the defaults", "[config]") {
  for (const char* text : {"", "   ", "\t\n"}) {
    Config c = parse_ok(text);
    CHECK(c == Config{});
    CHECK(c.expandable_segments);
    CHECK(c.max_split_size_bytes == kNoLimit);
    CHECK(c.max_non_split_rounding_bytes == 20 * kMiB);
    CHECK(c.large_segment_size_bytes == 20 * kMiB);
    for (auto d : c.roundup_power2_divisions) CHECK(d == 0);
    CHECK(c.garbage_collection_threshold == 0.0);
    CHECK(c.per_process_memory_fraction == 1.0);
    CHECK(c.small_piece_bytes == 2 * kMiB);
    CHECK(c.recycle);
    CHECK(c.recycle_budget == 0.0);
    CHECK(c.recycle_burst_ms == 0);
    CHECK(c.recycle_slack == 0.008);
    CHECK(c.recycle_ceiling == 0.015);
    CHECK(c.recycle_churn == 0.3);
    CHECK(c.recycle_keep_mappings);
    CHECK(c.recycle_wait == RecycleWait::fence);
    CHECK(c.max_piece_bytes == 8 * kMiB);
    CHECK(c.frontier_piece_bytes == 0);
    CHECK(c.short_pieces_below_bytes == 0);
    CHECK(c.footprint_pieces == 512);
    CHECK(c.recycle_overhang);
    CHECK(c.recycle_headroom == 0.0);
    CHECK(c.thread_cache);
  }
}

TEST_CASE("config: booleans are exactly True or False", "[config]") {
  struct BoolKey {
    const char* key;
    bool Config::*field;
  };
  const BoolKey keys[] = {
      {"expandable_segments", &Config::expandable_segments},
      {"recycle", &Config::recycle},
      {"recycle_overhang", &Config::recycle_overhang},
      {"thread_cache", &Config::thread_cache},
      {"check_invariants", &Config::check_invariants},
  };
  for (const auto& k : keys) {
    std::string key = k.key;
    CHECK(parse_ok(key + ":True").*k.field == true);
    CHECK(parse_ok(key + ":False").*k.field == false);
    check_error(key + ":true", {key + ":true", "exactly True or False", "expected True or False",
                                "e.g. "});
    check_error(key + ":1", {key + ":1", "True or False"});
    check_error(key + ":yes", {key + ":yes", "is not a boolean", "True or False"});
    check_error(key + ":", {key, "has no value", "True or False"});
    check_error(key + ":[True]", {key, "is a list", "True or False"});
  }
}

TEST_CASE("config: large_segment_size_mb must exceed 10 and is applied first", "[config]") {
  CHECK(parse_ok("large_segment_size_mb:11").large_segment_size_bytes == 11 * kMiB);
  CHECK(parse_ok("large_segment_size_mb:64").large_segment_size_bytes == 64 * kMiB);
  // max_non_split_rounding follows it unless given.
  CHECK(parse_ok("large_segment_size_mb:64").max_non_split_rounding_bytes == 64 * kMiB);
  CHECK(parse_ok("large_segment_size_mb:64,max_non_split_rounding_mb:100")
            .max_non_split_rounding_bytes == 100 * kMiB);
  check_error("large_segment_size_mb:10", {"large_segment_size_mb:10", "is too small", "> 10"});
  check_error("large_segment_size_mb:0", {"large_segment_size_mb:0", "> 10"});
  // Written after max_split_size_mb, it still constrains it (PyTorch parses it first).
  check_error("max_split_size_mb:30,large_segment_size_mb:40",
              {"max_split_size_mb:30", "smaller than the large segment size (40 MiB)", ">= 40"});
  CHECK(parse_ok("max_split_size_mb:40,large_segment_size_mb:40").max_split_size_bytes == 40 * kMiB);
}

TEST_CASE("config: max_split_size_mb", "[config]") {
  CHECK(parse_ok("max_split_size_mb:20").max_split_size_bytes == 20 * kMiB);
  CHECK(parse_ok("max_split_size_mb:512").max_split_size_bytes == 512 * kMiB);
  CHECK(parse_ok("max_split_size_mb:unlimited").max_split_size_bytes == kNoLimit);
  check_error("max_split_size_mb:19", {"max_split_size_mb:19", "smaller than the large segment",
                                       ">= 20", "e.g. max_split_size_mb:512"});
  check_error("max_split_size_mb:0", {"max_split_size_mb:0", ">= 20"});
  check_error("max_split_size_mb:lots", {"max_split_size_mb:lots", "not a whole number"});
}

TEST_CASE("config: max_non_split_rounding_mb", "[config]") {
  CHECK(parse_ok("max_non_split_rounding_mb:20").max_non_split_rounding_bytes == 20 * kMiB);
  CHECK(parse_ok("max_non_split_rounding_mb:1024").max_non_split_rounding_bytes == 1024 * kMiB);
  check_error("max_non_split_rounding_mb:19",
              {"max_non_split_rounding_mb:19", "smaller than the large segment", ">= 20"});
  check_error("large_segment_size_mb:32,max_non_split_rounding_mb:20",
              {"max_non_split_rounding_mb:20", ">= 32"});
}

TEST_CASE("config: numbers are plain non-negative decimals that fit", "[config]") {
  check_error("max_split_size_mb:12abc", {"max_split_size_mb:12abc", "is not a whole number",
                                          "expected a whole number of MiB"});
  check_error("max_split_size_mb:-512", {"max_split_size_mb:-512", "is negative"});
  check_error("max_split_size_mb:+512", {"max_split_size_mb:+512", "is not a whole number"});
  check_error("max_split_size_mb:0x200", {"max_split_size_mb:0x200", "is not a whole number"});
  check_error("max_split_size_mb:5.5", {"max_split_size_mb:5.5", "is not a whole number"});
  check_error("max_split_size_mb:99999999999999999999999",
              {"max_split_size_mb:99999999999999999999999", "is too large"});
  // Fits in 64 bits as MiB but not as bytes.
  check_error("memory_limit_mb:18446744073709551615",
              {"memory_limit_mb:18446744073709551615", "is too large", "64 bits"});
  check_error("memory_limit_mb:17592186044416", {"memory_limit_mb:17592186044416", "too large"});
  CHECK(parse_ok("memory_limit_mb:17592186044415").memory_limit_bytes == 17592186044415ull * kMiB);
  check_error("garbage_collection_threshold:0.5x",
              {"garbage_collection_threshold:0.5x", "is not a number"});
  check_error("garbage_collection_threshold:1e999",
              {"garbage_collection_threshold:1e999", "out of range"});
}

TEST_CASE("config: roundup_power2_divisions", "[config]") {
  auto buckets = [](const std::string& text) { return parse_ok(text).roundup_power2_divisions; };
  SECTION("one number for every bucket") {
    for (auto d : buckets("roundup_power2_divisions:4")) CHECK(d == 4);
    for (auto d : buckets("roundup_power2_divisions:1")) CHECK(d == 1);
    for (auto d : buckets("roundup_power2_divisions:0")) CHECK(d == 0);
    check_error("roundup_power2_divisions:3",
                {"roundup_power2_divisions:3", "not a power of 2 or 0", "e.g. roundup_power2_divisions:["});
    check_error("roundup_power2_divisions:4294967296",
                {"roundup_power2_divisions:4294967296", "too large"});
    check_error("roundup_power2_divisions:four", {"roundup_power2_divisions:four", "not a whole number"});
  }
  SECTION("a list: the first boundary covers the buckets below it, '>' the ones above the last") {
    auto b = buckets("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]");
    for (std::size_t i = 0; i < 8; ++i) CHECK(b[i] == 1);  // 1 MB .. 128 MB
    CHECK(b[8] == 1);   // [256 MB, 512 MB)
    CHECK(b[9] == 2);   // [512 MB, 1 GB)
    CHECK(b[10] == 4);  // [1 GB, 2 GB)
    for (std::size_t i = 11; i < 16; ++i) CHECK(b[i] == 8);
  }
  SECTION("a list without '>' leaves the buckets above the last boundary off") {
    auto b = buckets("roundup_power2_divisions:[1:2,64:16]");
    CHECK(b[0] == 2);
    for (std::size_t i = 1; i < 6; ++i) CHECK(b[i] == 0);
    CHECK(b[6] == 16);
    for (std::size_t i = 7; i < 16; ++i) CHECK(b[i] == 0);
  }
  SECTION("'>' alone covers every bucket; 32768 MB is the last bucket") {
    for (auto d : buckets("roundup_power2_divisions:[>:4]")) CHECK(d == 4);
    auto b = buckets("roundup_power2_divisions:[ 32768 : 2 ]");
    for (std::size_t i = 0; i < 16; ++i) CHECK(b[i] == 2);
    b = buckets("roundup_power2_divisions:[2:0,4:2]");
    CHECK(b[0] == 0);
    CHECK(b[1] == 0);
    CHECK(b[2] == 2);
  }
  SECTION("bad lists") {
    check_error("roundup_power2_divisions:[3:4]", {"roundup_power2_divisions:[3:4]", "boundary 3",
                                                   "not a power of 2", "expected N, or a list"});
    check_error("roundup_power2_divisions:[0:4]", {"boundary 0", "not a power of 2"});
    check_error("roundup_power2_divisions:[65536:4]", {"boundary 65536", "between 1 and 32768"});
    check_error("roundup_power2_divisions:[x:4]", {"boundary 'x'", "not a whole number"});
    check_error("roundup_power2_divisions:[256:3]", {"division count 3", "not a power of 2 or 0"});
    check_error("roundup_power2_divisions:[256:-2]", {"division count '-2'", "is negative"});
    check_error("roundup_power2_divisions:[256:x]", {"division count 'x'", "not a whole number"});
    check_error("roundup_power2_divisions:[256:8589934592]", {"division count 8589934592", "too large"});
    check_error("roundup_power2_divisions:[512:2,256:4]", {"boundary 256", "does not increase"});
    check_error("roundup_power2_divisions:[256:2,256:4]", {"boundary 256", "does not increase"});
    check_error("roundup_power2_divisions:[>:4,256:2]", {"'>' must be the last item"});
    check_error("roundup_power2_divisions:[]", {"roundup_power2_divisions:[]", "is an empty list"});
    check_error("roundup_power2_divisions:[256]", {"roundup_power2_divisions:[256]", "the item '256' has no ':N'"});
    check_error("roundup_power2_divisions:[256:]", {"roundup_power2_divisions:[256:", "malformed at ']'",
                                                   "list items look like a:b"});
    check_error("roundup_power2_divisions:[256:1 512:2]",
                {"roundup_power2_divisions:[256:1512", "malformed at ':'"});  // white space is dropped
    check_error("roundup_power2_divisions:[256:1;512:2]", {"roundup_power2_divisions:[256:1;512",
                                                          "malformed at ':'", "separate list items with ','"});
    check_error("roundup_power2_divisions:[256:1,512:2", {"'[' after roundup_power2_divisions: is never closed"});
    check_error("roundup_power2_divisions:[256:[1]]", {"malformed"});
    check_error("roundup_power2_divisions:", {"roundup_power2_divisions has no value"});
  }
}

TEST_CASE("config: garbage_collection_threshold is in (0, 1)", "[config]") {
  CHECK(parse_ok("garbage_collection_threshold:0.8").garbage_collection_threshold == 0.8);
  CHECK(parse_ok("garbage_collection_threshold:0.000001").garbage_collection_threshold == 1e-6);
  CHECK(parse_ok("garbage_collection_threshold:.5").garbage_collection_threshold == 0.5);
  CHECK(parse_ok("garbage_collection_threshold:0").garbage_collection_threshold == 0.0);  // off
  check_error("garbage_collection_threshold:1.5",
              {"gpumem config: garbage_collection_threshold:1.5 is out of range; expected a number in "
               "(0, 1)",
               "e.g. garbage_collection_threshold:0.8"});
  check_error("garbage_collection_threshold:1", {"garbage_collection_threshold:1 is out of range"});
  check_error("garbage_collection_threshold:-0.2", {"garbage_collection_threshold:-0.2", "out of range"});
  check_error("garbage_collection_threshold:nan", {"garbage_collection_threshold:nan", "out of range"});
  check_error("garbage_collection_threshold:inf", {"garbage_collection_threshold:inf", "out of range"});
  check_error("garbage_collection_threshold:high", {"garbage_collection_threshold:high", "not a number"});
}

TEST_CASE("config: per_process_memory_fraction is in [0, 1]", "[config]") {
  CHECK(parse_ok("per_process_memory_fraction:0").per_process_memory_fraction == 0.0);
  CHECK(parse_ok("per_process_memory_fraction:1").per_process_memory_fraction == 1.0);
  CHECK(parse_ok("per_process_memory_fraction:0.25").per_process_memory_fraction == 0.25);
  check_error("per_process_memory_fraction:1.01",
              {"per_process_memory_fraction:1.01 is out of range", "[0, 1]"});
  check_error("per_process_memory_fraction:-0.5", {"per_process_memory_fraction:-0.5", "[0, 1]"});
  check_error("per_process_memory_fraction:half", {"per_process_memory_fraction:half", "not a number"});
}

TEST_CASE("config: gpumem's engine keys", "[config]") {
  CHECK(parse_ok("memory_limit_mb:40960").memory_limit_bytes == 40960 * kMiB);
  CHECK(parse_ok("memory_limit_mb:0").memory_limit_bytes == 0);

  CHECK(parse_ok("small_piece_size_mb:2").small_piece_bytes == 2 * kMiB);
  CHECK(parse_ok("small_piece_size_mb:8").small_piece_bytes == 8 * kMiB);
  check_error("small_piece_size_mb:3", {"small_piece_size_mb:3", "positive multiple of 2"});
  check_error("small_piece_size_mb:0", {"small_piece_size_mb:0", "positive multiple of 2"});

  CHECK(parse_ok("max_piece_size_mb:16").max_piece_bytes == 16 * kMiB);
  CHECK(parse_ok("frontier_piece_size_mb:32").frontier_piece_bytes == 32 * kMiB);
  CHECK(parse_ok("frontier_piece_size_mb:0").frontier_piece_bytes == 0);
  check_error("frontier_piece_size_mb:3", {"frontier_piece_size_mb:3", "multiple of 2", "0 turns it off"});
  check_error("frontier_piece_size_mb:-2", {"frontier_piece_size_mb:-2"});
  CHECK(parse_ok("short_pieces_below_mb:4096").short_pieces_below_bytes == 4096 * kMiB);
  CHECK(parse_ok("short_pieces_below_mb:0").short_pieces_below_bytes == 0);
  check_error("short_pieces_below_mb:-1", {"short_pieces_below_mb:-1"});
  check_error("short_pieces_below_mb:4GiB", {"short_pieces_below_mb:4GiB"});
  CHECK(parse_ok("footprint_pieces:512").footprint_pieces == 512);
  CHECK(parse_ok("footprint_pieces:0").footprint_pieces == 0);
  check_error("footprint_pieces:-512", {"footprint_pieces:-512"});
  check_error("footprint_pieces:0.5", {"footprint_pieces:0.5"});
  check_error("footprint_pieces:1/512", {"footprint_pieces:1/512"});
  CHECK(parse_ok("recycle_budget:0").recycle_budget == 0.0);  // no driver time for recycling
  CHECK(parse_ok("recycle_budget:1").recycle_budget == 1.0);
  check_error("recycle_budget:-0.001", {"recycle_budget:-0.001", "out of range", "[0, 1]"});
  check_error("recycle_budget:1.5", {"recycle_budget:1.5", "out of range"});
  CHECK(parse_ok("recycle_ceiling:0.02").recycle_ceiling == 0.02);
  CHECK(parse_ok("recycle_ceiling:0").recycle_ceiling == 0.0);
  check_error("recycle_ceiling:1", {"recycle_ceiling:1", "out of range", "[0, 1)"});
  check_error("recycle_ceiling:-0.1", {"recycle_ceiling:-0.1", "out of range"});
  CHECK(parse_ok("recycle_churn:0.3").recycle_churn == 0.3);
  CHECK(parse_ok("recycle_churn:0").recycle_churn == 0.0);
  check_error("recycle_churn:1", {"recycle_churn:1", "out of range", "[0, 1)"});
  check_error("recycle_churn:-0.2", {"recycle_churn:-0.2", "out of range"});
  check_error("recycle_churn:lots", {"recycle_churn:lots", "[0, 1)"});
  CHECK(parse_ok("recycle_headroom:0.01").recycle_headroom == 0.01);
  CHECK(parse_ok("recycle_headroom:0").recycle_headroom == 0.0);
  check_error("recycle_headroom:1", {"recycle_headroom:1", "out of range", "[0, 1)"});
  check_error("recycle_headroom:-0.1", {"recycle_headroom:-0.1", "out of range"});
  CHECK(parse_ok("recycle_wait:sync").recycle_wait == RecycleWait::sync);
  CHECK(parse_ok("recycle_wait:fence").recycle_wait == RecycleWait::fence);
  check_error("recycle_wait:always", {"recycle_wait:always", "not a way to wait", "fence", "sync"});
  check_error("recycle_wait:Fence", {"recycle_wait:Fence", "fence", "sync"});
  check_error("max_piece_size_mb:5", {"max_piece_size_mb:5", "positive multiple of 2"});
  check_error("max_piece_size_mb:0", {"max_piece_size_mb:0", "positive multiple of 2"});

  CHECK(parse_ok("arenas:1").arenas == 1);
  CHECK(parse_ok("arenas:64").arenas == 64);
  CHECK(parse_ok("arenas:auto").arenas == kArenasAuto);
  check_error("arenas:0", {"arenas:0", "auto or a whole number from 1 to 64"});
  check_error("arenas:65", {"arenas:65", "from 1 to 64"});
  check_error("arenas:Auto", {"arenas:Auto", "auto or a whole number"});
  // arenas:auto, the default: kAutoArenas engines per device, one with step_plan:True.
  CHECK(Config{}.arenas == kArenasAuto);
  CHECK(engines_per_device(Config{}) == kAutoArenas);
  CHECK(kAutoArenas == 4);
  CHECK(engines_per_device(parse_ok("arenas:1")) == 1);
  CHECK(engines_per_device(parse_ok("arenas:7")) == 7);
  CHECK(to_string(Config{}).find(",arenas:auto,") != std::string::npos);
  CHECK(parse_ok("step_plan:True").step_plan);
  CHECK(parse_ok("step_plan:True").arenas == kArenasAuto);
  // The planner sits in front of the arenas: step_plan leaves the engines per device as they are.
  CHECK(engines_per_device(parse_ok("step_plan:True")) == kAutoArenas);
  CHECK(engines_per_device(parse_ok("step_plan:True,arenas:auto")) == kAutoArenas);
  CHECK_FALSE(parse_ok("step_plan:False").step_plan);
  CHECK(parse_ok("step_plan:True,arenas:1").step_plan);
  CHECK(engines_per_device(parse_ok("step_plan:True,arenas:4")) == 4);
  CHECK(parse_ok("step_plan:True,arenas:4").step_plan);
  check_error("step_plan:sometimes", {"step_plan:sometimes", "True or False"});

  CHECK(parse_ok("va_reserve_mb:0").va_reserve_bytes == 0);
  CHECK(parse_ok("va_reserve_mb:20").va_reserve_bytes == 20 * kMiB);
  CHECK(parse_ok("va_reserve_mb:262144").va_reserve_bytes == 262144 * kMiB);
  check_error("va_reserve_mb:8", {"va_reserve_mb:8", "cannot hold one piece (20 MiB", ">= 20"});
  // Checked against both piece sizes whatever the order.
  check_error("va_reserve_mb:30,small_piece_size_mb:32", {"va_reserve_mb:30", ">= 32"});
  check_error("va_reserve_mb:30,large_segment_size_mb:40", {"va_reserve_mb:30", ">= 40"});
}

TEST_CASE("config: syntax errors say what was expected", "[config]") {
  check_error("expandable_segments", {"expandable_segments has no ':' and no value", "True or False"});
  check_error("expandable_segments:True:False",
              {"unexpected ':' after expandable_segments:True", "separate entries with ','"});
  check_error("expandable_segments:True max_split_size_mb:512",
              {"expandable_segments:Truemax_split_size_mb", "separate entries"});
  check_error(",expandable_segments:True", {"empty entry"});
  check_error("expandable_segments:True,,recycle:False", {"empty entry"});
  check_error(":True", {"found ':' where a key was expected"});
  check_error("]", {"found ']' where a key was expected"});
  check_error("[a:b]", {"found '[' where a key was expected"});
  check_error("expandable_segments:True]", {"unexpected ']' after expandable_segments:True"});
  // A trailing ',' is accepted, as PyTorch does.
  CHECK_FALSE(parse_ok("expandable_segments:False,").expandable_segments);
}

TEST_CASE("config: unknown keys are named, with the accepted keys and a suggestion", "[config]") {
  check_error("foo:1", {"unknown key 'foo'", "accepted keys: large_segment_size_mb, expandable_segments",
                        "check_invariants"});
  check_error("expandable_segment:True", {"unknown key 'expandable_segment'",
                                          "did you mean 'expandable_segments'?"});
  check_error("max_split_size:512", {"did you mean 'max_split_size_mb'?"});
  // Keys of newer PyTorch versions than 2.11 are unknown here.
  check_error("throw_on_cudamalloc_oom:True", {"unknown key 'throw_on_cudamalloc_oom'"});
  // Unknown keys are reported before anything else is checked.
  check_error("garbage_collection_threshold:7,bogus:1", {"unknown key 'bogus'"});
  // The keys of the layers above (adapter, forensics) are not the engine's: its parse refuses them.
  for (const char* other : {"source:sim", "trace_entries:5", "record_ops:True", "backend:native",
                            "pinned_num_register_threads:8"}) {
    const std::string key = std::string(other).substr(0, std::string(other).find(':'));
    check_error(other, {"unknown key '" + key + "'", "accepted keys: large_segment_size_mb"});
  }
}

TEST_CASE("config: a key given twice is an error", "[config]") {
  check_error("expandable_segments:True,expandable_segments:False",
              {"expandable_segments is given twice", "expandable_segments:True and "
                                                     "expandable_segments:False"});
  check_error("recycle:True,max_split_size_mb:64,recycle:True", {"recycle is given twice"});
}

TEST_CASE("config: white space is ignored", "[config]") {
  Config c = parse_ok("  expandable_segments : False ,\n max_split_size_mb : 1 28 ,"
                      " roundup_power2_divisions : [ 256 : 1 , > : 4 ] ");
  CHECK_FALSE(c.expandable_segments);
  CHECK(c.max_split_size_bytes == 128 * kMiB);
  CHECK(c.roundup_power2_divisions[8] == 1);
  CHECK(c.roundup_power2_divisions[9] == 4);
}

TEST_CASE("config: a PyTorch-style string keeps its meaning", "[config]") {
  Config c = parse_ok(
      "max_split_size_mb:128,max_non_split_rounding_mb:64,"
      "garbage_collection_threshold:0.6,expandable_segments:False,"
      "roundup_power2_divisions:[64:8,256:4,1024:4,>:1],"
      "per_process_memory_fraction:0.5");
  CHECK(c.max_split_size_bytes == 128 * kMiB);
  CHECK(c.max_non_split_rounding_bytes == 64 * kMiB);
  CHECK(c.garbage_collection_threshold == 0.6);
  CHECK_FALSE(c.expandable_segments);
  CHECK(c.roundup_power2_divisions[0] == 8);
  CHECK(c.roundup_power2_divisions[6] == 8);
  CHECK(c.roundup_power2_divisions[7] == 0);
  CHECK(c.roundup_power2_divisions[8] == 4);
  CHECK(c.roundup_power2_divisions[10] == 4);
  CHECK(c.roundup_power2_divisions[11] == 1);
  CHECK(c.roundup_power2_divisions[15] == 1);
  CHECK(c.per_process_memory_fraction == 0.5);
}

TEST_CASE("config: to_string is canonical and round-trips", "[config]") {
  SECTION("defaults") {
    Config d;
    std::string s = to_string(d);
    CHECK(s.find("expandable_segments:True") != std::string::npos);
    CHECK(s.find("max_split_size_mb:unlimited") != std::string::npos);
    CHECK(parse_ok(s) == d);
    CHECK(to_string(parse_ok(s)) == s);
    // It names every key once.
    for (auto k : config_keys()) CHECK(s.find(std::string(k) + ":") != std::string::npos);
    CHECK(std::count(s.begin(), s.end(), ',') + 1 == static_cast<long>(config_keys().size()));
  }
  SECTION("every key away from its default") {
    Config c = parse_ok(gpumem::testing::kEngineKeysAwayFromDefault);
    gpumem::testing::check_engine_fields_away_from_default(c);

    std::string canonical = to_string(c);
    INFO(canonical);
    Config back = parse_ok(canonical);
    CHECK(back == c);
    CHECK(to_string(back) == canonical);
    CHECK(canonical.find("roundup_power2_divisions:[1:4,2:4,4:0,") != std::string::npos);
  }
  SECTION("each field matters to equality") {
    Config a = parse_ok("recycle:False");
    Config b = parse_ok(" recycle : False , ");
    CHECK(a == b);
    b.check_invariants = true;
    CHECK_FALSE(a == b);
  }
  SECTION("seeded random configurations") {
    gpumem::testing::check_random_round_trips<Config, ConfigError>(
        parse_config, [](const Config& c) { return to_string(c); }, gpumem::testing::engine_key_choices(),
        20250611, 2000);
  }
}

TEST_CASE("config: config_keys names every engine key, and each is known", "[config]") {
  auto keys = config_keys();
  CHECK(keys.size() == 29);  // 7 PyTorch 2.11 keys + 22 of gpumem's engine
  for (auto k : keys) {
    // Every key is known: a nonsense value is refused for the value, never as an unknown key.
    auto r = parse_config(std::string(k) + ":@");
    REQUIRE(std::holds_alternative<ConfigError>(r));
    std::string msg = std::get<ConfigError>(r).message;
    INFO(msg);
    CHECK(msg.find("unknown key") == std::string::npos);
    CHECK(msg.find(std::string(k) + ":@") != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
  }
}
