#include "autocast_state.h"

#include <ATen/autocast_mode.h>

namespace gpumem::ckpt::detail {

AutocastState AutocastState::capture() {
  AutocastState s;
  s.cpu_enabled = at::autocast::is_autocast_enabled(c10::DeviceType::CPU);
  s.cuda_enabled = at::autocast::is_autocast_enabled(c10::DeviceType::CUDA);
  s.cpu_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CPU);
  s.cuda_dtype = at::autocast::get_autocast_dtype(c10::DeviceType::CUDA);
  s.cache_enabled = at::autocast::is_autocast_cache_enabled();
  return s;
}

void AutocastState::apply() const {
  at::autocast::set_autocast_enabled(c10::DeviceType::CPU, cpu_enabled);
  at::autocast::set_autocast_enabled(c10::DeviceType::CUDA, cuda_enabled);
  at::autocast::set_autocast_dtype(c10::DeviceType::CPU, cpu_dtype);
  at::autocast::set_autocast_dtype(c10::DeviceType::CUDA, cuda_dtype);
  at::autocast::set_autocast_cache_enabled(cache_enabled);
}

AutocastStateGuard::AutocastStateGuard(const AutocastState& apply)
    : outside_(AutocastState::capture()) {
  apply.apply();
}

AutocastStateGuard::~AutocastStateGuard() { outside_.apply(); }

AutocastCacheOff::AutocastCacheOff() : was_enabled_(at::autocast::is_autocast_cache_enabled()) {
  at::autocast::set_autocast_cache_enabled(false);
}

AutocastCacheOff::~AutocastCacheOff() { at::autocast::set_autocast_cache_enabled(was_enabled_); }

}  // namespace gpumem::ckpt::detail
