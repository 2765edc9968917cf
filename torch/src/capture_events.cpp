#include "capture_events.h"

#include <utility>

namespace gpumem::torch::detail {

CaptureAwareEvents::CaptureAwareEvents(alloc::StreamEvents& inner, const CaptureGate& gate,
                                       std::function<void()> sync_device)
    : inner_(inner), gate_(gate), sync_device_(std::move(sync_device)) {}

CaptureAwareEvents::~CaptureAwareEvents() {
  // Engines release every marker they record before they go; anything left was never recorded
  // on a stream or is returned here.
  std::lock_guard lock(mutex_);
  for (auto& [token, d] : deferred_)
    if (d.real != 0) inner_.release(d.real);
}

alloc::EventToken CaptureAwareEvents::record(alloc::StreamId stream) {
  if (!gate_.open()) return inner_.record(stream);
  std::lock_guard lock(mutex_);
  const alloc::EventToken token = kDeferredBit | ++next_;
  deferred_.emplace(token, Deferred{stream, 0});
  return token;
}

alloc::EventToken CaptureAwareEvents::realize(alloc::EventToken token) {
  std::lock_guard lock(mutex_);
  Deferred& d = deferred_.at(token);
  if (d.real == 0) d.real = inner_.record(d.stream);
  return d.real;
}

bool CaptureAwareEvents::query(alloc::EventToken token) {
  if (gate_.open()) return false;
  if (token & kDeferredBit) return inner_.query(realize(token));
  return inner_.query(token);
}

void CaptureAwareEvents::synchronize(alloc::EventToken token) {
  if (gate_.open()) return;
  if (token & kDeferredBit) return inner_.synchronize(realize(token));
  inner_.synchronize(token);
}

void CaptureAwareEvents::release(alloc::EventToken token) {
  if (!(token & kDeferredBit)) return inner_.release(token);
  alloc::EventToken real = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = deferred_.find(token);
    if (it == deferred_.end()) return;
    real = it->second.real;
    deferred_.erase(it);
  }
  if (real != 0) inner_.release(real);
}

void CaptureAwareEvents::synchronize_stream(alloc::StreamId stream) {
  if (sync_device_) return sync_device_();
  inner_.synchronize_stream(stream);
}

std::size_t CaptureAwareEvents::deferred_unrecorded() const {
  std::lock_guard lock(mutex_);
  std::size_t n = 0;
  for (const auto& [token, d] : deferred_) n += d.real == 0;
  return n;
}

}  // namespace gpumem::torch::detail
