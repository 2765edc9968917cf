// torch::Config: everything a process running gpumem under libtorch is configured with, parsed
// once from one string (GPUMEM_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF;
// docs/config.md documents every key). Each layer owns its keys and the type they fill:
//
//   engine     alloc::Config        the caching engine (PyTorch's allocator keys, gpumem's engine keys)
//   adapter    torch::AdapterConfig the memory source per device, PyTorch's compatibility keys
//   forensics  forensics::Config    trace ring, OOM postmortem, per-op attribution
//
// parse_config() parses the string against the three layers' key tables at once
// (gpumem/alloc/config_syntax.h): one tokenization, one error form, the nearest key of any layer
// suggested for a misspelt one. It is the one entry point for the configuration users write.
//
// This header and config.cpp include no torch header (the gpumem_torch_config library), so the
// parse is built and tested without libtorch too.
//
// Thread-safety: a plain value; parse_config and config_from_environment are reentrant.
#pragma once

#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "gpumem/alloc/config.h"
#include "gpumem/forensics/config.h"
#include "gpumem/torch/adapter_config.h"

namespace gpumem::torch {

using alloc::ConfigError;

struct Config {
  alloc::Config engine;
  AdapterConfig adapter;
  forensics::Config forensics;
  // The string this config was parsed from (reported in snapshots as PyTorch's
  // last_allocator_settings); empty for a Config built in code.
  std::string source_string;

  // Same settings: every field except source_string (two spellings of one configuration are
  // equal). parse_config(to_string(c)) == c for every Config parse_config produces.
  friend bool operator==(const Config& a, const Config& b) noexcept {
    return a.engine == b.engine && a.adapter == b.adapter && a.forensics == b.forensics;
  }
};

// Parses a config string: every layer's keys. Never throws; messages start with "gpumem config: ".
std::variant<Config, ConfigError> parse_config(std::string_view text);

// Parses the first of GPUMEM_ALLOC_CONF, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_ALLOC_CONF that is set
// (even if empty; the variables are not merged); defaults when none is. Keys those variables carry
// that gpumem does not use, such as backend:native, are accepted and ignored;
// backend:cudaMallocAsync is an error, since gpumem replaces that allocator. Error messages name
// the variable they came from.
std::variant<Config, ConfigError> config_from_environment();

// A canonical `key:value,...` string of every setting: the engine's keys, then the adapter's, then
// the forensics keys (for snapshots and logs).
std::string to_string(const Config& config);

// Every key parse_config accepts (canonical names in the order above, then aliases).
std::vector<std::string_view> config_keys();

}  // namespace gpumem::torch
