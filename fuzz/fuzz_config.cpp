// libFuzzer target: the configuration string users write (GPUMEM_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF)
// -> torch::parse_config. It never throws; an accepted string must round-trip through to_string
// (config.h's promise), an error must start with "gpumem config: ".
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <variant>

#include "gpumem/torch/config.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace gt = gpumem::torch;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto parsed = gt::parse_config(text);
  if (const auto* c = std::get_if<gt::Config>(&parsed)) {
    const auto again = gt::parse_config(gt::to_string(*c));
    const auto* c2 = std::get_if<gt::Config>(&again);
    if (!c2 || !(*c2 == *c)) __builtin_trap();  // to_string wrote what parse_config refuses or reads otherwise
  } else if (std::get<gt::ConfigError>(parsed).message.rfind("gpumem config: ", 0) != 0) {
    __builtin_trap();
  }
  return 0;
}
