// Helpers shared by the configuration tests: tests/allocator/test_config.cpp (the engine's keys,
// alloc::parse_config) and tests/torch/test_config.cpp (every layer's keys, torch::parse_config).
// Parse expecting a value or one error, and round trips of seeded random configurations through
// to_string.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "catch.h"

namespace gpumem::testing {

// Parse is a parse_config: std::variant<Config, Error>(std::string_view).
template <class Config, class Error, class Parse>
Config parse_ok(Parse parse, const std::string& text) {
  auto r = parse(text);
  if (auto* e = std::get_if<Error>(&r)) FAIL("unexpected error for '" << text << "': " << e->message);
  return std::get<Config>(r);
}

template <class Config, class Error, class Parse>
std::string parse_err(Parse parse, const std::string& text) {
  auto r = parse(text);
  if (std::holds_alternative<Config>(r)) FAIL("'" << text << "' parsed but should have failed");
  return std::get<Error>(r).message;
}

// The error names the key and the bad value, says what is accepted, and is one line.
template <class Config, class Error, class Parse>
void check_error(Parse parse, const std::string& text, const std::vector<std::string>& must_contain) {
  INFO("config: " << text);
  std::string msg = parse_err<Config, Error>(parse, text);
  INFO("message: " << msg);
  CHECK(msg.rfind("gpumem config: ", 0) == 0);
  CHECK(msg.find('\n') == std::string::npos);
  for (const auto& part : must_contain) CHECK(msg.find(part) != std::string::npos);
}

// One key and the values a random configuration may give it.
struct KeyChoices {
  std::string key;
  std::vector<std::string> values;
};

// `iterations` random configurations (each key given with probability 1/2, one of its values, in a
// shuffled order), seeded: each either parses and round-trips through to_string (parse(to_string(c))
// == c and to_string is a fixed point), or is refused by one of the cross-key size rules.
template <class Config, class Error, class Parse, class ToString>
void check_random_round_trips(Parse parse, ToString to_string, const std::vector<KeyChoices>& keys, std::uint64_t seed,
                              int iterations) {
  std::mt19937_64 rng(seed);
  for (int iter = 0; iter < iterations; ++iter) {
    std::vector<std::string> parts;
    for (const KeyChoices& k : keys) {
      std::string value = k.values[rng() % k.values.size()];
      if (rng() % 2) parts.push_back(k.key + ":" + value);
    }
    std::shuffle(parts.begin(), parts.end(), rng);
    std::string text;
    for (const auto& p : parts) text += (text.empty() ? "" : ",") + p;
    INFO(text);
    auto r = parse(text);
    if (auto* e = std::get_if<Error>(&r)) {
      // Only the cross-key rules may refuse these combinations: sizes.
      CHECK((e->message.find("smaller than the large segment size") != std::string::npos ||
             e->message.find("cannot hold one piece") != std::string::npos));
      continue;
    }
    const Config& c = std::get<Config>(r);
    std::string canonical = to_string(c);
    INFO(canonical);
    Config back = parse_ok<Config, Error>(parse, canonical);
    REQUIRE(back == c);
    REQUIRE(to_string(back) == canonical);
  }
}

}  // namespace gpumem::testing
