#include <cstdio>
#include <cstdlib>

#include "gpumem/alloc/manual_stream_events.h"

namespace gpumem::alloc {
namespace {

class ImmediateEvents final : public StreamEvents {
 public:
  EventToken record(StreamId) override { return 1; }
  bool query(EventToken) override { return true; }
  void synchronize(EventToken) override {}
  void release(EventToken) override {}
  void synchronize_stream(StreamId) override {}
};

}  // namespace

std::unique_ptr<StreamEvents> make_immediate_events() { return std::make_unique<ImmediateEvents>(); }

EventToken ManualStreamEvents::record(StreamId stream) {
  std::lock_guard lock(mutex_);
  EventToken t = next_++;
  markers_.emplace(t, Marker{stream, false});
  return t;
}

bool ManualStreamEvents::query(EventToken token) {
  std::lock_guard lock(mutex_);
  auto it = markers_.find(token);
  if (it == markers_.end()) {
    std::fprintf(stderr, "gpumem: ManualStreamEvents::query of unknown marker %llu\n",
                 static_cast<unsigned long long>(token));
    std::abort();
  }
  return it->second.complete;
}

void ManualStreamEvents::synchronize(EventToken token) {
  std::lock_guard lock(mutex_);
  ++synchronize_calls_;
  auto it = markers_.find(token);
  if (it != markers_.end()) it->second.complete = true;
}

void ManualStreamEvents::release(EventToken token) {
  std::lock_guard lock(mutex_);
  markers_.erase(token);
}

void ManualStreamEvents::synchronize_stream(StreamId stream) {
  {
    std::lock_guard lock(mutex_);
    ++synchronize_calls_;
  }
  complete_stream(stream);
}

void ManualStreamEvents::complete_stream(StreamId stream) {
  std::lock_guard lock(mutex_);
  for (auto& [token, marker] : markers_)
    if (marker.stream == stream) marker.complete = true;
}

void ManualStreamEvents::complete_all() {
  std::lock_guard lock(mutex_);
  for (auto& [token, marker] : markers_) marker.complete = true;
}

std::size_t ManualStreamEvents::outstanding() const {
  std::lock_guard lock(mutex_);
  return markers_.size();
}

std::uint64_t ManualStreamEvents::synchronize_calls() const {
  std::lock_guard lock(mutex_);
  return synchronize_calls_;
}

}  // namespace gpumem::alloc
