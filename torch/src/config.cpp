// One parse of the whole configuration string against the key tables of the engine, the adapter
// and forensics (gpumem/torch/config.h). No torch header here.
#include "gpumem/torch/config.h"

namespace gpumem::torch {
namespace {

std::variant<Config, ConfigError> parse_with_prefix(std::string_view text, std::string_view prefix) {
  Config c;
  c.source_string = std::string(text);
  const alloc::config_syntax::KeyTable tables[] = {alloc::config_key_table(c.engine), adapter_key_table(c.adapter),
                                                   forensics::config_key_table(c.forensics)};
  if (auto error = alloc::config_syntax::parse_config_text(text, prefix, tables)) return *error;
  return c;
}

}  // namespace

std::variant<Config, ConfigError> parse_config(std::string_view text) {
  return parse_with_prefix(text, alloc::config_syntax::error_prefix(""));
}

std::variant<Config, ConfigError> config_from_environment() {
  const alloc::config_syntax::EnvironmentText env = alloc::config_syntax::config_text_from_environment();
  if (env.variable.empty()) return Config{};
  return parse_with_prefix(env.text, alloc::config_syntax::error_prefix(env.variable));
}

std::string to_string(const Config& c) {
  return alloc::to_string(c.engine) + "," + to_string(c.adapter) + "," + forensics::to_string(c.forensics);
}

std::vector<std::string_view> config_keys() {
  Config unused;
  const alloc::config_syntax::KeyTable tables[] = {alloc::config_key_table(unused.engine),
                                                   adapter_key_table(unused.adapter),
                                                   forensics::config_key_table(unused.forensics)};
  return alloc::config_syntax::key_names(tables);
}

}  // namespace gpumem::torch
