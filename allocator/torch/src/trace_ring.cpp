#include "trace_ring.h"

#include <utility>

namespace gpumem::torch::detail {
namespace {

thread_local std::shared_ptr<void> t_pending_context;

}  // namespace

void TraceRing::set_thread_context(std::shared_ptr<void> context) { t_pending_context = std::move(context); }

void TraceRing::configure(const TraceSettings& settings, bool clear) {
  std::lock_guard lock(mutex_);
  if (clear || settings.capacity < buffer_.size()) {
    buffer_.clear();
    head_ = 0;
  } else if (buffer_.size() == settings_.capacity && head_ != 0) {
    // The ring was full and wrapped; straighten it so it can keep growing to the new capacity.
    std::vector<TraceRecord> ordered;
    ordered.reserve(buffer_.size());
    for (std::size_t i = 0; i < buffer_.size(); ++i) ordered.push_back(std::move(buffer_[(head_ + i) % buffer_.size()]));
    buffer_ = std::move(ordered);
    head_ = 0;
  }
  settings_ = settings;
  update_active_locked();
}

TraceSettings TraceRing::settings() const {
  std::lock_guard lock(mutex_);
  return settings_;
}

void TraceRing::clear() {
  std::lock_guard lock(mutex_);
  buffer_.clear();
  head_ = 0;
}

void TraceRing::add_hook(Hook hook) {
  std::lock_guard lock(mutex_);
  hooks_.push_back(std::move(hook));
  update_active_locked();
}

void TraceRing::set_user_metadata(std::string metadata) {
  std::lock_guard lock(mutex_);
  user_metadata_ = std::move(metadata);
}

std::string TraceRing::user_metadata() const {
  std::lock_guard lock(mutex_);
  return user_metadata_;
}

void TraceRing::push_compile_context(std::string context) {
  std::lock_guard lock(mutex_);
  compile_contexts_.push_back(std::move(context));
}

void TraceRing::pop_compile_context() {
  std::lock_guard lock(mutex_);
  if (!compile_contexts_.empty()) compile_contexts_.pop_back();
}

void TraceRing::update_active_locked() {
  active_.store(settings_.capacity > 0 || !hooks_.empty(), std::memory_order_release);
}

void TraceRing::append_locked(TraceRecord&& record) {
  if (settings_.capacity == 0) return;
  if (buffer_.size() < settings_.capacity) {
    buffer_.push_back(std::move(record));
  } else {
    buffer_[head_] = std::move(record);
    head_ = (head_ + 1) % buffer_.size();
  }
}

void TraceRing::on_events(std::span<const alloc::AllocEvent> events) {
  if (!active()) return;
  std::shared_ptr<void> context = std::move(t_pending_context);
  std::vector<Hook> hooks;
  std::vector<TraceRecord> for_hooks;
  {
    std::lock_guard lock(mutex_);
    for (const auto& event : events) {
      if (settings_.skip_mask & skip_bit(event.kind)) continue;
      // OOM records come from record() with the provider's free bytes; the engine's own oom
      // event would be a duplicate without them.
      if (event.kind == alloc::EventKind::oom) continue;
      TraceRecord record;
      record.event = event;
      if (event.kind == alloc::EventKind::alloc && settings_.contexts) record.context = context;
      if (!compile_contexts_.empty()) record.compile_context = compile_contexts_.back();
      record.user_metadata = user_metadata_;
      if (!hooks_.empty()) for_hooks.push_back(record);
      append_locked(std::move(record));
    }
    if (!for_hooks.empty()) hooks = hooks_;
  }
  for (const auto& record : for_hooks)
    for (const auto& hook : hooks) hook(record);
}

void TraceRing::record(TraceRecord record) {
  if (!active()) return;
  std::vector<Hook> hooks;
  {
    std::lock_guard lock(mutex_);
    if (settings_.skip_mask & skip_bit(record.event.kind)) return;
    if (!compile_contexts_.empty() && record.compile_context.empty()) record.compile_context = compile_contexts_.back();
    if (record.user_metadata.empty()) record.user_metadata = user_metadata_;
    hooks = hooks_;
    if (hooks.empty()) {
      append_locked(std::move(record));
      return;
    }
    append_locked(TraceRecord(record));
  }
  for (const auto& hook : hooks) hook(record);
}

std::vector<TraceRecord> TraceRing::records() const {
  std::lock_guard lock(mutex_);
  std::vector<TraceRecord> out;
  out.reserve(buffer_.size());
  for (std::size_t i = 0; i < buffer_.size(); ++i) out.push_back(buffer_[(head_ + i) % buffer_.size()]);
  return out;
}

}  // namespace gpumem::torch::detail
