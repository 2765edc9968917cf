// The configuration users write (torch::Config): one parse of every layer's keys (the engine's, the
// adapter's, the forensics keys), the canonical string of all of them, the environment. The shared
// syntax and the engine's keys one by one are tested in tests/allocator/test_config.cpp.
#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "catch.h"
#include "config_test_support.h"
#include "engine_config_cases.h"
#include "gpumem/torch/config.h"

using namespace gpumem::torch;
using gpumem::alloc::kMiB;
using gpumem::alloc::kNoLimit;

namespace {

Config parse_ok(const std::string& text) { return gpumem::testing::parse_ok<Config, ConfigError>(parse_config, text); }

void check_error(const std::string& text, const std::vector<std::string>& must_contain) {
  gpumem::testing::check_error<Config, ConfigError>(parse_config, text, must_contain);
}

struct EnvGuard {  // clears the three variables on entry and exit
  EnvGuard() { clear(); }
  ~EnvGuard() { clear(); }
  static void clear() {
    unsetenv("GPUMEM_ALLOC_CONF");
    unsetenv("PYTORCH_CUDA_ALLOC_CONF");
    unsetenv("PYTORCH_ALLOC_CONF");
  }
};

}  // namespace

TEST_CASE("config: empty and blank strings give the defaults", "[config]") {
  for (const char* text : {"", "   ", "\t\n"}) {
    Config c = parse_ok(text);
    CHECK(c == Config{});
    CHECK(c.engine.expandable_segments);
    CHECK(c.engine.max_split_size_bytes == kNoLimit);
    CHECK(c.engine.max_non_split_rounding_bytes == 20 * kMiB);
    CHECK(c.engine.large_segment_size_bytes == 20 * kMiB);
    for (auto d : c.engine.roundup_power2_divisions) CHECK(d == 0);
    CHECK(c.engine.garbage_collection_threshold == 0.0);
    CHECK(c.engine.per_process_memory_fraction == 1.0);
    CHECK(c.adapter.pinned_num_register_threads == 1);
    CHECK(c.adapter.source == SourceKind::cuda_vmm);
    CHECK(c.engine.small_piece_bytes == 2 * kMiB);
    CHECK(c.engine.recycle);
    CHECK(c.engine.thread_cache);
    CHECK(c.forensics.trace_entries == 0);
    CHECK(c.forensics.oom_report_dir.empty());
    CHECK_FALSE(c.forensics.record_ops);
    CHECK(c.forensics.python_stacks == gpumem::forensics::StackMode::automatic);
    CHECK(c.forensics.python_stacks_min_bytes == 1024 * 1024);  // large-pool requests only
    CHECK_FALSE(c.forensics.python_stacks_on());
    CHECK(c.source_string == text);
  }
}

TEST_CASE("config: booleans of the adapter and forensics are exactly True or False", "[config]") {
  struct BoolKey {
    const char* key;
    bool* (*field)(Config&);
  };
  const BoolKey keys[] = {
      {"release_lock_on_cudamalloc", [](Config& c) { return &c.adapter.release_lock_on_cudamalloc; }},
      {"release_lock_on_hipmalloc", [](Config& c) { return &c.adapter.release_lock_on_cudamalloc; }},
      {"pinned_use_cuda_host_register", [](Config& c) { return &c.adapter.pinned_use_cuda_host_register; }},
      {"pinned_use_hip_host_register", [](Config& c) { return &c.adapter.pinned_use_cuda_host_register; }},
      {"pinned_use_background_threads", [](Config& c) { return &c.adapter.pinned_use_background_threads; }},
      {"graph_capture_record_stream_reuse", [](Config& c) { return &c.adapter.graph_capture_record_stream_reuse; }},
      {"record_ops", [](Config& c) { return &c.forensics.record_ops; }},
  };
  for (const auto& k : keys) {
    std::string key = k.key;
    Config on = parse_ok(key + ":True");
    Config off = parse_ok(key + ":False");
    CHECK(*k.field(on) == true);
    CHECK(*k.field(off) == false);
    check_error(key + ":true", {key + ":true", "exactly True or False", "expected True or False",
                                "e.g. "});
    check_error(key + ":1", {key + ":1", "True or False"});
    check_error(key + ":yes", {key + ":yes", "is not a boolean", "True or False"});
    check_error(key + ":", {key, "has no value", "True or False"});
    check_error(key + ":[True]", {key, "is a list", "True or False"});
  }
}

TEST_CASE("config: numbers of every layer are plain non-negative decimals", "[config]") {
  check_error("trace_entries:1e5", {"trace_entries:1e5", "is not a whole number"});
  check_error("max_split_size_mb:12abc", {"max_split_size_mb:12abc", "is not a whole number"});
  check_error("pinned_reserve_segment_size_mb:18446744073709551615",
              {"pinned_reserve_segment_size_mb:18446744073709551615", "too large", "64 bits"});
}

TEST_CASE("config: pinned allocator keys", "[config]") {
  for (unsigned n : {1u, 2u, 8u, 64u, 128u})
    CHECK(parse_ok("pinned_num_register_threads:" + std::to_string(n)).adapter.pinned_num_register_threads == n);
  check_error("pinned_num_register_threads:3", {"pinned_num_register_threads:3", "not a power of 2",
                                                "a power of 2 from 1 to 128"});
  check_error("pinned_num_register_threads:0", {"pinned_num_register_threads:0", "not a power of 2"});
  check_error("pinned_num_register_threads:256", {"pinned_num_register_threads:256", "too large"});
  CHECK(parse_ok("pinned_reserve_segment_size_mb:256").adapter.pinned_reserve_segment_size_bytes == 256 * kMiB);
  CHECK(parse_ok("pinned_reserve_segment_size_mb:0").adapter.pinned_reserve_segment_size_bytes == 0);
  check_error("pinned_reserve_segment_size_mb:-1", {"pinned_reserve_segment_size_mb:-1", "negative"});
}

TEST_CASE("config: backend", "[config]") {
  CHECK(parse_ok("backend:native") == Config{});
  check_error("backend:cudaMallocAsync",
              {"backend:cudaMallocAsync", "gpumem replaces", "backend:native"});
  check_error("backend:rmm", {"backend:rmm", "not a known backend", "native"});
  check_error("backend:[native]", {"backend", "is a list"});
}

TEST_CASE("config: the adapter's source and the forensics keys", "[config]") {
  CHECK(parse_ok("source:cuda_vmm").adapter.source == SourceKind::cuda_vmm);
  CHECK(parse_ok("source:cuda_malloc").adapter.source == SourceKind::cuda_malloc);
  CHECK(parse_ok("source:host_vmm").adapter.source == SourceKind::host_vmm);
  CHECK(parse_ok("source:sim").adapter.source == SourceKind::sim);
  check_error("source:gpu", {"source:gpu", "not a known memory source", "cuda_vmm, cuda_malloc, host_vmm or sim"});
  check_error("source:SIM", {"source:SIM", "cuda_vmm"});

  CHECK(parse_ok("").adapter.pinned_allocator == PinnedAllocatorKind::native);
  CHECK(parse_ok("pinned_allocator:native").adapter.pinned_allocator == PinnedAllocatorKind::native);
  CHECK(parse_ok("pinned_allocator:gpumem").adapter.pinned_allocator == PinnedAllocatorKind::gpumem);
  check_error("pinned_allocator:jemalloc",
              {"pinned_allocator:jemalloc", "not a known pinned host allocator", "native (PyTorch's) or gpumem"});
  check_error("pinned_allocator:[gpumem]", {"pinned_allocator", "is a list"});
  check_error("pinned_alocator:gpumem", {"unknown key 'pinned_alocator'", "did you mean 'pinned_allocator'"});

  CHECK(parse_ok("trace_entries:100000").forensics.trace_entries == 100000);
  CHECK(parse_ok("trace_entries:1073741824").forensics.trace_entries == 1073741824);
  check_error("trace_entries:1073741825", {"trace_entries:1073741825", "too large", "1073741824"});

  CHECK(parse_ok("oom_report_dir:/tmp/oom").forensics.oom_report_dir == "/tmp/oom");
  CHECK(parse_ok("oom_report_dir: /tmp/my reports ").forensics.oom_report_dir == "/tmp/my reports");
  CHECK(parse_ok("oom_report_dir:,record_ops:True").forensics.oom_report_dir.empty());
  CHECK(parse_ok("oom_report_dir:").forensics.oom_report_dir.empty());
  check_error("oom_report_dir:/a:b", {"unexpected ':' after oom_report_dir:/a", "cannot contain"});
  check_error("oom_report_dir:[x:y]", {"oom_report_dir", "is a list"});

  using gpumem::forensics::StackMode;
  CHECK(parse_ok("oom_report_dir:/tmp/oom").forensics.python_stacks_on());  // auto follows oom_report_dir
  CHECK_FALSE(parse_ok("oom_report_dir:/tmp/oom,python_stacks:False").forensics.python_stacks_on());
  CHECK(parse_ok("python_stacks:True").forensics.python_stacks_on());
  CHECK(parse_ok("python_stacks:auto").forensics.python_stacks == StackMode::automatic);
  CHECK(parse_ok("python_stacks_min_kb:64").forensics.python_stacks_min_bytes == 64 * 1024);
  check_error("python_stacks:yes", {"python_stacks:yes", "auto", "True or False"});
  check_error("python_stacks:true", {"python_stacks:true", "exactly True or False"});
  check_error("python_stacks_min_kb:-1", {"python_stacks_min_kb", "negative"});
  check_error("python_stacks_min_kb:1MB", {"python_stacks_min_kb:1MB", "KiB"});
}

TEST_CASE("config: unknown keys are named, with the accepted keys and a suggestion", "[config]") {
  check_error("foo:1", {"unknown key 'foo'", "accepted keys: large_segment_size_mb, expandable_segments",
                        "record_ops"});
  check_error("expandable_segment:True", {"unknown key 'expandable_segment'",
                                          "did you mean 'expandable_segments'?"});
  check_error("max_split_size:512", {"did you mean 'max_split_size_mb'?"});
  // Keys of newer PyTorch versions than 2.11 are unknown here.
  check_error("throw_on_cudamalloc_oom:True", {"unknown key 'throw_on_cudamalloc_oom'"});
  check_error("pinned_max_cached_size_mb:64", {"unknown key 'pinned_max_cached_size_mb'"});
  // Suggestions come from every layer's keys.
  check_error("trace_entrie:5", {"unknown key 'trace_entrie'", "did you mean 'trace_entries'?"});
  check_error("sourc:sim", {"did you mean 'source'?"});
  // Unknown keys are reported before anything else is checked.
  check_error("garbage_collection_threshold:7,bogus:1", {"unknown key 'bogus'"});
}

TEST_CASE("config: a key given twice is an error (aliases count)", "[config]") {
  check_error("expandable_segments:True,expandable_segments:False",
              {"expandable_segments is given twice", "expandable_segments:True and "
                                                     "expandable_segments:False"});
  check_error("release_lock_on_cudamalloc:True,release_lock_on_hipmalloc:False",
              {"release_lock_on_cudamalloc is given twice", "release_lock_on_hipmalloc:False"});
  check_error("record_ops:True,source:sim,record_ops:False", {"record_ops is given twice"});
}

TEST_CASE("config: values are applied in the order written, whatever their layer", "[config]") {
  // The first bad value written is the one reported.
  check_error("trace_entries:x,max_split_size_mb:y", {"trace_entries:x"});
  check_error("max_split_size_mb:y,trace_entries:x", {"max_split_size_mb:y"});
  check_error("source:gpu,recycle:maybe", {"source:gpu"});
  // large_segment_size_mb still goes first, wherever it is written.
  check_error("record_ops:True,max_split_size_mb:30,large_segment_size_mb:40", {"max_split_size_mb:30", ">= 40"});
}

TEST_CASE("config: a PyTorch-style string keeps its meaning", "[config]") {
  Config c = parse_ok(
      "backend:native,max_split_size_mb:128,max_non_split_rounding_mb:64,"
      "garbage_collection_threshold:0.6,expandable_segments:False,"
      "roundup_power2_divisions:[64:8,256:4,1024:4,>:1],pinned_use_background_threads:True,"
      "per_process_memory_fraction:0.5,pinned_num_register_threads:8");
  CHECK(c.engine.max_split_size_bytes == 128 * kMiB);
  CHECK(c.engine.max_non_split_rounding_bytes == 64 * kMiB);
  CHECK(c.engine.garbage_collection_threshold == 0.6);
  CHECK_FALSE(c.engine.expandable_segments);
  CHECK(c.engine.roundup_power2_divisions[0] == 8);
  CHECK(c.engine.roundup_power2_divisions[6] == 8);
  CHECK(c.engine.roundup_power2_divisions[7] == 0);
  CHECK(c.engine.roundup_power2_divisions[8] == 4);
  CHECK(c.engine.roundup_power2_divisions[10] == 4);
  CHECK(c.engine.roundup_power2_divisions[11] == 1);
  CHECK(c.engine.roundup_power2_divisions[15] == 1);
  CHECK(c.adapter.pinned_use_background_threads);
  CHECK(c.engine.per_process_memory_fraction == 0.5);
  CHECK(c.adapter.pinned_num_register_threads == 8);
}

TEST_CASE("config: to_string is canonical and round-trips", "[config]") {
  SECTION("defaults") {
    Config d;
    std::string s = to_string(d);
    CHECK(s.find("expandable_segments:True") != std::string::npos);
    CHECK(s.find("max_split_size_mb:unlimited") != std::string::npos);
    CHECK(parse_ok(s) == d);
    CHECK(to_string(parse_ok(s)) == s);
    // It names every canonical key once.
    for (const Config& c : {d}) {
      std::string text = to_string(c);
      std::size_t canonical = 0;
      for (auto k : config_keys()) {
        if (k == "release_lock_on_hipmalloc" || k == "pinned_use_hip_host_register") continue;
        if (k == "backend") continue;  // not a setting: nothing to show
        ++canonical;
        CHECK(text.find(std::string(k) + ":") != std::string::npos);
      }
      CHECK(std::count(text.begin(), text.end(), ',') + 1 == static_cast<long>(canonical));
    }
  }
  SECTION("every key away from its default") {
    // The engine's keys (tests/support/engine_config_cases.h), then the adapter's and forensics'.
    std::string text = std::string(gpumem::testing::kEngineKeysAwayFromDefault) +
                       ",release_lock_on_hipmalloc:True,pinned_use_hip_host_register:True,"
                       "pinned_num_register_threads:16,pinned_reserve_segment_size_mb:64,"
                       "pinned_use_background_threads:True,graph_capture_record_stream_reuse:True,source:sim,"
                       "pinned_allocator:gpumem,trace_entries:5000,oom_report_dir:/tmp/o,"
                       "record_ops:True,python_stacks:True,python_stacks_min_kb:256";
    Config c = parse_ok(text);
    Config d;
    gpumem::testing::check_engine_fields_away_from_default(c.engine);
    CHECK(c.adapter.release_lock_on_cudamalloc != d.adapter.release_lock_on_cudamalloc);
    CHECK(c.adapter.pinned_use_cuda_host_register != d.adapter.pinned_use_cuda_host_register);
    CHECK(c.adapter.pinned_num_register_threads != d.adapter.pinned_num_register_threads);
    CHECK(c.adapter.pinned_reserve_segment_size_bytes != d.adapter.pinned_reserve_segment_size_bytes);
    CHECK(c.adapter.pinned_use_background_threads != d.adapter.pinned_use_background_threads);
    CHECK(c.adapter.graph_capture_record_stream_reuse != d.adapter.graph_capture_record_stream_reuse);
    CHECK(c.adapter.source != d.adapter.source);
    CHECK(c.adapter.pinned_allocator != d.adapter.pinned_allocator);
    CHECK(c.forensics.trace_entries != d.forensics.trace_entries);
    CHECK(c.forensics.oom_report_dir != d.forensics.oom_report_dir);
    CHECK(c.forensics.record_ops != d.forensics.record_ops);
    CHECK(c.forensics.python_stacks != d.forensics.python_stacks);
    CHECK(c.forensics.python_stacks_min_bytes != d.forensics.python_stacks_min_bytes);
    CHECK_FALSE(c == d);

    std::string canonical = to_string(c);
    INFO(canonical);
    Config back = parse_ok(canonical);
    CHECK(back == c);
    CHECK(back.source_string == canonical);
    CHECK(to_string(back) == canonical);
    CHECK(canonical.find("release_lock_on_cudamalloc:True") != std::string::npos);
    CHECK(canonical.find("roundup_power2_divisions:[1:4,2:4,4:0,") != std::string::npos);
    // Each layer's keys, then the next layer's.
    CHECK(canonical.rfind(gpumem::alloc::to_string(c.engine) + "," + to_string(c.adapter) + "," +
                              gpumem::forensics::to_string(c.forensics),
                          0) == 0);
  }
  SECTION("equality ignores source_string, and each field matters") {
    Config a = parse_ok("recycle:False");
    Config b = parse_ok(" recycle : False , ");
    CHECK(a.source_string != b.source_string);
    CHECK(a == b);
    b.forensics.trace_entries = 1;
    CHECK_FALSE(a == b);
    b = a;
    b.adapter.source = SourceKind::sim;
    CHECK_FALSE(a == b);
    b = a;
    b.engine.check_invariants = true;
    CHECK_FALSE(a == b);
  }
  SECTION("seeded random configurations") {
    // The engine's keys (tests/support/engine_config_cases.h), then the adapter's and forensics'.
    std::vector<gpumem::testing::KeyChoices> keys = gpumem::testing::engine_key_choices();
    keys.insert(keys.end(), {
                                {"release_lock_on_cudamalloc", {"True", "False"}},
                                {"pinned_num_register_threads", {"1", "4", "128"}},
                                {"pinned_reserve_segment_size_mb", {"0", "1", "512"}},
                                {"source", {"cuda_vmm", "cuda_malloc", "host_vmm", "sim"}},
                                {"pinned_allocator", {"native", "gpumem"}},
                                {"trace_entries", {"0", "1", "400000"}},
                                {"oom_report_dir", {"", "/tmp/x", "rel/dir"}},
                                {"record_ops", {"True", "False"}},
                                {"python_stacks", {"auto", "True", "False"}},
                                {"python_stacks_min_kb", {"0", "1", "1024"}},
                            });
    gpumem::testing::check_random_round_trips<Config, ConfigError>(
        parse_config, [](const Config& c) { return to_string(c); }, keys,
        20250611, 2000);
  }
}

TEST_CASE("config: the environment, in precedence order", "[config][env]") {
  EnvGuard guard;
  auto from_env = [] {
    auto r = config_from_environment();
    if (auto* e = std::get_if<ConfigError>(&r)) FAIL("unexpected error: " << e->message);
    return std::get<Config>(r);
  };
  auto env_error = [] {
    auto r = config_from_environment();
    REQUIRE(std::holds_alternative<ConfigError>(r));
    return std::get<ConfigError>(r).message;
  };

  CHECK(from_env() == Config{});  // nothing set

  setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:300", 1);
  CHECK(from_env().engine.max_split_size_bytes == 300 * kMiB);

  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:200", 1);
  CHECK(from_env().engine.max_split_size_bytes == 200 * kMiB);  // PYTORCH_CUDA_ALLOC_CONF beats it

  setenv("GPUMEM_ALLOC_CONF", "max_split_size_mb:100,source:sim", 1);
  Config c = from_env();
  CHECK(c.engine.max_split_size_bytes == 100 * kMiB);  // GPUMEM_ALLOC_CONF beats both
  CHECK(c.adapter.source == SourceKind::sim);
  CHECK(c.source_string == "max_split_size_mb:100,source:sim");

  setenv("GPUMEM_ALLOC_CONF", "", 1);  // set but empty: still wins, the variables are not merged
  CHECK(from_env() == Config{});

  setenv("GPUMEM_ALLOC_CONF", "garbage_collection_threshold:1.5", 1);
  std::string msg = env_error();
  CHECK(msg.rfind("gpumem config (from GPUMEM_ALLOC_CONF): garbage_collection_threshold:1.5 is out "
                  "of range", 0) == 0);

  unsetenv("GPUMEM_ALLOC_CONF");
  setenv("PYTORCH_CUDA_ALLOC_CONF", "backend:cudaMallocAsync", 1);
  msg = env_error();
  CHECK(msg.find("(from PYTORCH_CUDA_ALLOC_CONF)") != std::string::npos);
  CHECK(msg.find("gpumem replaces") != std::string::npos);

  // PyTorch's keys keep their meaning in PyTorch's variables.
  setenv("PYTORCH_CUDA_ALLOC_CONF",
         "backend:native,expandable_segments:False,release_lock_on_cudamalloc:True,"
         "pinned_use_cuda_host_register:True,pinned_num_register_threads:4",
         1);
  c = from_env();
  CHECK_FALSE(c.engine.expandable_segments);
  CHECK(c.adapter.release_lock_on_cudamalloc);
  CHECK(c.adapter.pinned_use_cuda_host_register);
  CHECK(c.adapter.pinned_num_register_threads == 4);

  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
  setenv("PYTORCH_ALLOC_CONF", "bogus:1", 1);
  msg = env_error();
  CHECK(msg.rfind("gpumem config (from PYTORCH_ALLOC_CONF): unknown key 'bogus'", 0) == 0);
}

TEST_CASE("config: to_string(SourceKind) and config_keys", "[config]") {
  CHECK(std::string(to_string(SourceKind::cuda_vmm)) == "cuda_vmm");
  CHECK(std::string(to_string(SourceKind::cuda_malloc)) == "cuda_malloc");
  CHECK(std::string(to_string(SourceKind::host_vmm)) == "host_vmm");
  CHECK(std::string(to_string(SourceKind::sim)) == "sim");
  auto keys = config_keys();
  CHECK(keys.size() == 46);  // the engine's 29 (gpumem::alloc::config_keys()) + the adapter's and forensics' 17
  CHECK(std::string(to_string(PinnedAllocatorKind::native)) == "native");
  CHECK(std::string(to_string(PinnedAllocatorKind::gpumem)) == "gpumem");
  for (auto k : keys) {
    // Every key is known: a nonsense value is refused for the value, never as an unknown key.
    auto r = parse_config(std::string(k) + ":@");
    if (k == "oom_report_dir") {
      CHECK(std::holds_alternative<Config>(r));  // "@" is a valid (relative) directory name
      continue;
    }
    REQUIRE(std::holds_alternative<ConfigError>(r));
    std::string msg = std::get<ConfigError>(r).message;
    INFO(msg);
    CHECK(msg.find("unknown key") == std::string::npos);
    CHECK(msg.find(std::string(k) + ":@") != std::string::npos);
    CHECK(msg.find("expected") != std::string::npos);
  }
}

TEST_CASE("config: docs/config.md documents every key", "[config][docs]") {
  std::string root;
  if (const char* dir = std::getenv("GPUMEM_SOURCE_DIR")) {
    root = dir;
  } else {
    root = __FILE__;
    root = root.substr(0, root.rfind("/tests/"));
  }
  std::ifstream in(root + "/docs/config.md");
  REQUIRE(in.good());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string doc = ss.str();
  for (auto k : config_keys()) {
    INFO(k);
    CHECK(doc.find("`" + std::string(k)) != std::string::npos);
  }
  // Its section "The canonical string" shows to_string of the defaults, exactly: the first line of
  // the code block after that heading.
  const std::size_t heading = doc.find("## The canonical string");
  REQUIRE(heading != std::string::npos);
  const std::size_t block = doc.find("```\n", heading);
  REQUIRE(block != std::string::npos);
  const std::size_t line = block + 4;
  const std::string shown = doc.substr(line, doc.find('\n', line) - line);
  CHECK(shown == to_string(Config{}));
}
