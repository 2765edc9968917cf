#include "gpumem/forensics/policy_factory.h"

#include <algorithm>
#include <iterator>
#include <span>
#include <variant>

#include <fmt/format.h>

#include "gpumem/alloc/config.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/gpumem_policy.h"

namespace gpumem::forensics {
namespace {

// Keys of PYTORCH_CUDA_ALLOC_CONF the model uses (engine keys with PyTorch's meaning).
constexpr std::string_view kModelKeys[] = {
    "expandable_segments",          "max_split_size_mb",           "max_non_split_rounding_mb",
    "large_segment_size_mb",        "roundup_power2_divisions",    "garbage_collection_threshold",
    "per_process_memory_fraction",
};
// PyTorch keys the PyTorch model accepts and ignores: any value is taken (their validation is the
// torch adapter's, which owns them); they change nothing the replay can see.
struct IgnoredKeys {};
void ignore_value(const alloc::config_syntax::Entry&, const alloc::config_syntax::KeyInfo&, IgnoredKeys&) {}
constexpr alloc::config_syntax::Key<IgnoredKeys> kIgnoredKeys[] = {
    {{"backend", "", "native", "backend:native"}, ignore_value},
    {{"release_lock_on_cudamalloc", "release_lock_on_hipmalloc", "True or False", "release_lock_on_cudamalloc:False"},
     ignore_value},
    {{"pinned_use_cuda_host_register", "pinned_use_hip_host_register", "True or False",
      "pinned_use_cuda_host_register:True"},
     ignore_value},
    {{"pinned_num_register_threads", "", "a power of 2 from 1 to 128", "pinned_num_register_threads:8"}, ignore_value},
    {{"pinned_use_background_threads", "", "True or False", "pinned_use_background_threads:True"}, ignore_value},
    {{"pinned_reserve_segment_size_mb", "", "a whole number of MiB", "pinned_reserve_segment_size_mb:256"},
     ignore_value},
    {{"graph_capture_record_stream_reuse", "", "True or False", "graph_capture_record_stream_reuse:True"},
     ignore_value},
};

bool is_ignored_key(std::string_view key) {
  return std::any_of(std::begin(kIgnoredKeys), std::end(kIgnoredKeys),
                     [&](const auto& k) { return key == k.info.name || key == k.info.alias; });
}

// The keys at bracket depth 0 of a `k:v,k2:[a:b]` string.
std::vector<std::string> top_level_keys(std::string_view conf) {
  std::vector<std::string> keys;
  int depth = 0;
  std::string current;
  bool in_key = true;
  for (char c : conf) {
    if (c == ' ' || c == '\t') continue;
    if (c == '[') ++depth;
    if (c == ']') --depth;
    if (depth == 0 && c == ',') {
      if (!current.empty()) keys.push_back(current);
      current.clear();
      in_key = true;
      continue;
    }
    if (depth == 0 && c == ':' && in_key) {
      in_key = false;
      continue;
    }
    if (in_key) current += c;
  }
  if (!current.empty()) keys.push_back(current);
  return keys;
}

// conf's engine keys (gpumem's engine configuration; with_ignored: PyTorch's ignored keys too).
alloc::Config parse_gpumem_config(std::string_view conf, std::string_view policy, bool with_ignored) {
  alloc::Config config;
  IgnoredKeys ignored;
  const alloc::config_syntax::KeyTable tables[] = {alloc::config_key_table(config),
                                                   alloc::config_syntax::KeyTable(kIgnoredKeys, ignored)};
  const std::span<const alloc::config_syntax::KeyTable> used(tables, with_ignored ? 2 : 1);
  if (auto err = alloc::config_syntax::parse_config_text(conf, alloc::config_syntax::error_prefix(""), used)) {
    throw ForensicsError(fmt::format("policy '{}': {}", policy, err->message));
  }
  return config;
}

PytorchModelOptions pytorch_options_from(std::string_view conf, std::string_view policy, const ReplayEnvironment& env) {
  PytorchModelOptions o;
  o.device_total_bytes = env.device_total_bytes;
  o.cap_bytes = env.memory_limit_bytes;
  bool names_expandable = false;
  for (const std::string& key : top_level_keys(conf)) {
    const bool model = std::find(std::begin(kModelKeys), std::end(kModelKeys), key) != std::end(kModelKeys);
    const bool ignored = is_ignored_key(key);
    if (!model && !ignored) {
      throw ForensicsError(fmt::format(
          "policy '{}': '{}' is not a PYTORCH_CUDA_ALLOC_CONF key the PyTorch model uses; it takes "
          "expandable_segments, max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, "
          "roundup_power2_divisions, garbage_collection_threshold and per_process_memory_fraction",
          policy, key));
    }
    if (key == "expandable_segments") names_expandable = true;
  }
  const alloc::Config c = parse_gpumem_config(conf, policy, /*with_ignored=*/true);
  // gpumem defaults to expandable segments; PyTorch does not.
  o.expandable_segments = names_expandable && c.expandable_segments;
  o.max_split_size_bytes = c.max_split_size_bytes;
  o.max_non_split_rounding_bytes = c.max_non_split_rounding_bytes;
  o.large_segment_size_bytes = c.large_segment_size_bytes;
  o.roundup_power2_divisions = c.roundup_power2_divisions;
  o.garbage_collection_threshold = c.garbage_collection_threshold;
  if (c.per_process_memory_fraction < 1.0) {
    o.cap_bytes = std::min(o.cap_bytes, static_cast<std::size_t>(c.per_process_memory_fraction *
                                                                  static_cast<double>(o.device_total_bytes)));
  }
  return o;
}

}  // namespace

std::vector<std::string> default_policy_names() { return {"gpumem", "pytorch", "pytorch:expandable"}; }

std::string policy_forms_help() {
  return "  gpumem               gpumem's engine, default configuration (its step planner on: a step\n"
         "                       that repeats is found, or taken from --step-marker, and served from\n"
         "                       one range laid out once; gpumem:step_plan:False without it)\n"
         "  gpumem:CONF          gpumem's engine with configuration CONF (GPUMEM_ALLOC_CONF syntax)\n"
         "  gpumem+plan[:CONF]   gpumem[:CONF] with step_plan:True\n"
         "  pytorch              model of PyTorch 2.11's native allocator, default settings\n"
         "  pytorch:expandable   the same with expandable_segments:True\n"
         "  pytorch:CONF         the same with PYTORCH_CUDA_ALLOC_CONF string CONF, e.g.\n"
         "                       pytorch:max_split_size_mb:256,roundup_power2_divisions:4\n";
}

PolicySpec parse_policy_spec(std::string_view text, const ReplayEnvironment& env) {
  PolicySpec spec;
  spec.name = std::string(text);
  const auto colon = text.find(':');
  const std::string_view family = text.substr(0, colon);
  const std::string_view conf = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  if (colon != std::string_view::npos && conf.empty()) {
    throw ForensicsError(fmt::format("policy '{}': nothing after ':'; write '{}' alone or add a "
                                     "configuration string after the colon",
                                     text, family));
  }
  if (family == "pytorch") {
    PytorchModelOptions o;
    o.device_total_bytes = env.device_total_bytes;
    o.cap_bytes = env.memory_limit_bytes;
    if (conf == "expandable") {
      o.expandable_segments = true;
    } else if (!conf.empty()) {
      o = pytorch_options_from(conf, text, env);
    }
    spec.make = [name = spec.name, o] { return std::make_unique<PytorchPolicy>(name, o); };
    return spec;
  }
  if (family == "gpumem" || family == "gpumem+plan") {
    // gpumem+plan is gpumem with step_plan:True (checked with the rest).
    const std::string engine_conf = family == "gpumem+plan"
                                        ? (conf.empty() ? std::string("step_plan:True") : std::string(conf) + ",step_plan:True")
                                        : std::string(conf);
    alloc::Config config =
        engine_conf.empty() ? alloc::Config{} : parse_gpumem_config(engine_conf, text, /*with_ignored=*/false);
    if (env.memory_limit_bytes != std::numeric_limits<std::size_t>::max()) {
      config.memory_limit_bytes = config.memory_limit_bytes == 0
                                      ? env.memory_limit_bytes
                                      : std::min(config.memory_limit_bytes, env.memory_limit_bytes);
    }
    spec.step_plan = config.step_plan;
    spec.make = [name = spec.name, config, total = env.device_total_bytes] {
      return make_gpumem_policy(name, config, total);
    };
    return spec;
  }
  throw ForensicsError(fmt::format("unknown policy '{}'; the policies are:\n{}", text, policy_forms_help()));
}

}  // namespace gpumem::forensics
