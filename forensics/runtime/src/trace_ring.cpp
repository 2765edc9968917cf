#include "gpumem/forensics/trace_ring.h"

#include <utility>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {
namespace {

thread_local std::shared_ptr<void> t_pending_context;

// An engine oom event held for record_oom on the thread that published it.
struct HeldOom {
  const TraceRing* ring = nullptr;
  alloc::AllocEvent event;
};
thread_local HeldOom t_held_oom;

// The buffer is reserved up to this many records at once; beyond, it grows as records arrive.
constexpr std::size_t kReserveRecords = 65536;

const std::shared_ptr<void> kNoContext;
const std::string kNoText;

}  // namespace

const std::shared_ptr<void>& TraceRecord::stack_context() const noexcept {
  return notes ? notes->stack_context : kNoContext;
}
const std::string& TraceRecord::compile_context() const noexcept { return notes ? notes->compile_context : kNoText; }
const std::string& TraceRecord::user_metadata() const noexcept { return notes ? notes->user_metadata : kNoText; }

TraceRing::TraceRing(std::size_t capacity, bool record_ops) {
  if (capacity == 0) {
    throw ForensicsError("a trace ring needs a capacity of at least 1 record (trace_entries:0 turns tracing off: "
                         "do not create the ring then)");
  }
  record_ops_.store(record_ops, std::memory_order_relaxed);
  configure(TraceSettings{capacity, 0, false}, /*clear=*/true);
}

void TraceRing::set_thread_context(std::shared_ptr<void> context) { t_pending_context = std::move(context); }

void TraceRing::configure(const TraceSettings& settings, bool clear) {
  std::lock_guard lock(mutex_);
  if (clear) clear_locked();
  settings_ = settings;
  fit_locked();
  update_active_locked();
}

TraceSettings TraceRing::settings() const {
  std::lock_guard lock(mutex_);
  return settings_;
}

void TraceRing::keep_at_least(std::size_t records) {
  std::lock_guard lock(mutex_);
  floor_ = records;
  fit_locked();
  update_active_locked();
}

void TraceRing::leave_oom_to_caller(bool on) {
  std::lock_guard lock(mutex_);
  oom_to_caller_ = on;
}

void TraceRing::add_hook(Hook hook) {
  std::lock_guard lock(mutex_);
  hooks_.push_back(std::move(hook));
  update_active_locked();
}

void TraceRing::set_user_metadata(std::string metadata) {
  std::lock_guard lock(mutex_);
  user_metadata_ = std::move(metadata);
  refresh_notes_locked();
}

std::string TraceRing::user_metadata() const {
  std::lock_guard lock(mutex_);
  return user_metadata_;
}

void TraceRing::push_compile_context(std::string context) {
  std::lock_guard lock(mutex_);
  compile_contexts_.push_back(std::move(context));
  refresh_notes_locked();
}

void TraceRing::pop_compile_context() {
  std::lock_guard lock(mutex_);
  if (!compile_contexts_.empty()) compile_contexts_.pop_back();
  refresh_notes_locked();
}

void TraceRing::refresh_notes_locked() {
  if (user_metadata_.empty() && compile_contexts_.empty()) {
    current_notes_ = nullptr;
    return;
  }
  auto notes = std::make_shared<TraceNotes>();
  notes->user_metadata = user_metadata_;
  if (!compile_contexts_.empty()) notes->compile_context = compile_contexts_.back();
  current_notes_ = std::move(notes);
}

void TraceRing::update_active_locked() {
  active_.store(capacity_locked() > 0 || !hooks_.empty(), std::memory_order_release);
}

void TraceRing::clear_locked() {
  history_start_ = appended_;
  if (floor_ == 0) {
    buffer_.clear();
    head_ = 0;
    dropped_ = 0;
  }
}

void TraceRing::fit_locked() {
  const std::size_t cap = capacity_locked();
  if (buffer_.size() == cap) return;
  if (buffer_.size() > cap || head_ != 0) {
    // Straighten the ring (oldest first) and keep the newest records that fit.
    std::vector<TraceRecord> ordered = ordered_locked();
    const std::size_t drop = ordered.size() > cap ? ordered.size() - cap : 0;
    dropped_ += drop;
    buffer_.assign(std::make_move_iterator(ordered.begin() + static_cast<std::ptrdiff_t>(drop)),
                   std::make_move_iterator(ordered.end()));
    head_ = 0;
  }
  if (buffer_.capacity() < std::min(cap, kReserveRecords)) buffer_.reserve(std::min(cap, kReserveRecords));
}

void TraceRing::append_locked(TraceRecord&& record) {
  const std::size_t cap = capacity_locked();
  if (cap == 0) return;
  ++appended_;
  if (buffer_.size() < cap) {
    buffer_.push_back(std::move(record));
  } else {
    buffer_[head_] = std::move(record);
    head_ = head_ + 1 == buffer_.size() ? 0 : head_ + 1;
    ++dropped_;
  }
}

void TraceRing::on_events(std::span<const alloc::AllocEvent> events) {
  if (!active()) return;
  std::shared_ptr<void> context = std::move(t_pending_context);
  std::uint32_t op = 0, scope = 0;
  if (record_ops_.load(std::memory_order_relaxed)) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  std::vector<Hook> hooks;
  std::vector<TraceRecord> for_hooks;
  {
    std::lock_guard lock(mutex_);
    // Alloc records carry the stack context the adapter gathered for this call (one allocation
    // per batch, only while contexts are recorded).
    std::shared_ptr<const TraceNotes> with_context;
    if (context != nullptr && settings_.contexts) {
      auto notes = std::make_shared<TraceNotes>(current_notes_ ? *current_notes_ : TraceNotes{});
      notes->stack_context = std::move(context);
      with_context = std::move(notes);
    }
    for (const auto& event : events) {
      if (event.kind == alloc::EventKind::oom && oom_to_caller_) {
        t_held_oom = HeldOom{this, event};  // record_oom() keeps it, with the provider's free bytes
        continue;
      }
      const bool skipped = skipped_locked(event.kind);
      if (skipped && !stored_locked(event.kind)) continue;
      TraceRecord record{event, op, scope, current_notes_};
      if (event.kind == alloc::EventKind::alloc && with_context != nullptr) record.notes = with_context;
      if (!skipped && !hooks_.empty()) for_hooks.push_back(record);
      append_locked(std::move(record));
    }
    if (!for_hooks.empty()) hooks = hooks_;
  }
  for (const auto& record : for_hooks)
    for (const auto& hook : hooks) hook(record);
}

void TraceRing::record_oom(const alloc::AllocEvent& fallback, std::size_t device_free_bytes) {
  alloc::AllocEvent event = fallback;
  if (t_held_oom.ring == this) {
    event = t_held_oom.event;
    t_held_oom = HeldOom{};
  }
  if (!active()) return;
  std::uint32_t op = 0, scope = 0;
  if (record_ops_.load(std::memory_order_relaxed)) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  std::vector<Hook> hooks;
  TraceRecord record;
  {
    std::lock_guard lock(mutex_);
    const bool skipped = skipped_locked(event.kind);
    if (skipped && !stored_locked(event.kind)) return;
    auto notes = std::make_shared<TraceNotes>(current_notes_ ? *current_notes_ : TraceNotes{});
    notes->device_free_bytes = device_free_bytes;
    record = TraceRecord{event, op, scope, std::move(notes)};
    if (!skipped) hooks = hooks_;
    append_locked(TraceRecord(record));
  }
  for (const auto& hook : hooks) hook(record);
}

std::vector<TraceRecord> TraceRing::ordered_locked() const {
  std::vector<TraceRecord> out;
  out.reserve(buffer_.size());
  for (std::size_t i = 0; i < buffer_.size(); ++i) out.push_back(buffer_[(head_ + i) % buffer_.size()]);
  return out;
}

std::vector<TraceRecord> TraceRing::records() const {
  std::lock_guard lock(mutex_);
  return ordered_locked();
}

std::vector<TraceRecord> TraceRing::history() const {
  std::lock_guard lock(mutex_);
  std::vector<TraceRecord> out;
  if (settings_.capacity == 0) return out;
  // Ordinal of the oldest record kept: appended_ - buffer_.size().
  const std::uint64_t oldest = appended_ - buffer_.size();
  const std::size_t first = history_start_ > oldest ? static_cast<std::size_t>(history_start_ - oldest) : 0;
  for (std::size_t i = first; i < buffer_.size(); ++i) {
    const TraceRecord& r = buffer_[(head_ + i) % buffer_.size()];
    if (!skipped_locked(r.event.kind)) out.push_back(r);
  }
  if (out.size() > settings_.capacity)
    out.erase(out.begin(), out.begin() + static_cast<std::ptrdiff_t>(out.size() - settings_.capacity));
  return out;
}

std::size_t TraceRing::size() const {
  std::lock_guard lock(mutex_);
  return buffer_.size();
}

std::size_t TraceRing::capacity() const {
  std::lock_guard lock(mutex_);
  return capacity_locked();
}

std::uint64_t TraceRing::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

void TraceRing::clear() {
  std::lock_guard lock(mutex_);
  clear_locked();
}

}  // namespace gpumem::forensics
