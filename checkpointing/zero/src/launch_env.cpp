#include "gpumem/zero/launch_env.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <charconv>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <vector>

namespace gpumem::zero {
namespace {

constexpr std::array<const char*, 5> kVariables = {"RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                   "MASTER_ADDR", "MASTER_PORT"};

std::string_view trimmed(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

// Parses a whole decimal integer in [lo, hi]; anything else is one clear error.
long long parse_integer(const char* name, std::string_view raw, long long lo, long long hi,
                        std::string_view meaning) {
  const std::string_view text = trimmed(raw);
  long long value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size()) {
    throw LaunchEnvError(
        fmt::format("{}='{}' is not an integer; set it to {} (torchrun sets it for every process)",
                    name, raw, meaning));
  }
  if (value < lo || value > hi) {
    throw LaunchEnvError(
        fmt::format("{}={} is out of range: it must be {} ({}..{})", name, value, meaning, lo, hi));
  }
  return value;
}

}  // namespace

LaunchEnv parse_launch_env(const EnvLookup& lookup) {
  std::vector<std::string> missing;
  std::vector<std::string> present;
  for (const char* name : kVariables) {
    const char* v = lookup(name);
    if (v == nullptr) {
      missing.emplace_back(name);
    } else {
      present.emplace_back(name);
    }
  }
  LaunchEnv env;
  if (present.empty()) return env;  // a world of one, no rendezvous
  if (!missing.empty()) {
    throw LaunchEnvError(fmt::format(
        "incomplete launcher environment: {} set but {} missing; launch with torchrun, or set all "
        "of RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or none of them for a "
        "single process)",
        fmt::join(present, ", "), fmt::join(missing, ", ")));
  }
  env.from_environment = true;
  env.world_size = static_cast<int>(parse_integer("WORLD_SIZE", lookup("WORLD_SIZE"), 1, 1 << 24,
                                                  "the number of processes, at least 1"));
  env.rank = static_cast<int>(parse_integer("RANK", lookup("RANK"), 0, 1 << 24,
                                            "this process's global rank, 0..WORLD_SIZE-1"));
  if (env.rank >= env.world_size) {
    throw LaunchEnvError(fmt::format("RANK={} is not below WORLD_SIZE={}: ranks are 0..{}",
                                     env.rank, env.world_size, env.world_size - 1));
  }
  env.local_rank = static_cast<int>(parse_integer("LOCAL_RANK", lookup("LOCAL_RANK"), 0, 1 << 16,
                                                  "this process's rank on its node (its GPU)"));
  env.master_port = static_cast<std::uint16_t>(parse_integer(
      "MASTER_PORT", lookup("MASTER_PORT"), 1, 65535, "the TCP port of rank 0's store"));
  const std::string_view addr = trimmed(lookup("MASTER_ADDR"));
  if (addr.empty()) {
    throw LaunchEnvError(
        "MASTER_ADDR is empty; set it to the host name or IP address of the node running rank 0");
  }
  env.master_addr = std::string(addr);
  if (const char* agent = lookup("TORCHELASTIC_USE_AGENT_STORE")) {
    const std::string_view v = trimmed(agent);
    if (v == "True" || v == "true" || v == "1") {
      env.agent_store = true;
    } else if (v == "False" || v == "false" || v == "0" || v.empty()) {
      env.agent_store = false;
    } else {
      throw LaunchEnvError(fmt::format(
          "TORCHELASTIC_USE_AGENT_STORE='{}' is neither True nor False; torchrun sets True when "
          "its agent serves the store at MASTER_ADDR:MASTER_PORT (every rank is then a client), "
          "unset it or set False to have rank 0 serve the store",
          agent));
    }
  }
  return env;
}

LaunchEnv launch_env_from_environment() {
  return parse_launch_env([](const char* name) -> const char* { return std::getenv(name); });
}

std::string describe(const LaunchEnv& env) {
  if (!env.from_environment) return "single process (no launcher variables): rank 0 of 1";
  return fmt::format("rank {} of {} (local rank {}), store at {}:{} ({})", env.rank,
                     env.world_size, env.local_rank, env.master_addr, env.master_port,
                     env.agent_store ? "served by the launcher's agent" : "served by rank 0");
}

}  // namespace gpumem::zero
