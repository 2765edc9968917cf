#include "gpumem/forensics/trace_ring.h"

#include <cstring>
#include <utility>


#include "gpumem/forensics/alloc_context.h"
#include "gpumem/forensics/error.h"
#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {
namespace {

// An engine oom event held for record_oom on the thread that published it.
struct HeldOom {
  const TraceRing* ring = nullptr;
  alloc::AllocEvent event;
};
thread_local HeldOom t_held_oom;

// The buffer is reserved up to this many records at once; beyond, it grows as records arrive.
constexpr std::size_t kReserveRecords = 65536;
// How many records ahead of the oldest one a full ring fetches the line it will overwrite (a batch
// is one to four records; the fetch has an engine call's time to arrive).
constexpr std::size_t kPrefetchAhead = 4;

const std::shared_ptr<void> kNoContext;
const std::shared_ptr<const TraceNotes> kNoNotes;
const std::string kNoText;

}  // namespace

const std::shared_ptr<void>& TraceRecord::stack_context() const noexcept {
  return notes ? notes->stack_context : kNoContext;
}
const std::string& TraceRecord::compile_context() const noexcept { return notes ? notes->compile_context : kNoText; }
const std::string& TraceRecord::user_metadata() const noexcept { return notes ? notes->user_metadata : kNoText; }

TraceRing::TraceRing(std::size_t capacity, bool record_ops) : alloc::AllocObserver(alloc::kSleeping) {
  if (capacity == 0) {
    throw ForensicsError("a trace ring needs a capacity of at least 1 record (trace_entries:0 turns tracing off: "
                         "do not create the ring then)");
  }
  record_ops_.store(record_ops, std::memory_order_relaxed);
  configure(TraceSettings{capacity, 0, false}, /*clear=*/true);
}

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
  const bool active = capacity_locked() > 0 || !hooks_.empty();
  active_.store(active, std::memory_order_release);
  set_needs(active ? alloc::kNeedsSequence : alloc::kSleeping);
  contexts_.store(settings_.contexts, std::memory_order_relaxed);
}

void TraceRing::clear_locked() {
  history_start_ = appended_;
  if (floor_ == 0) {
    buffer_.clear();
    head_ = 0;
    dropped_ = 0;
    notes_.clear();
  }
}

void TraceRing::trim_notes_locked() {
  const std::uint64_t oldest = oldest_ordinal_locked();
  while (!notes_.empty() && notes_.front().last_ordinal < oldest) notes_.pop_front();
}

void TraceRing::fit_locked() {
  const std::size_t cap = capacity_locked();
  if (buffer_.size() == cap) return;
  if (buffer_.size() > cap || head_ != 0) {
    // Straighten the ring (oldest first) and keep the newest records that fit.
    const std::size_t drop = buffer_.size() > cap ? buffer_.size() - cap : 0;
    std::vector<Slot> ordered;
    ordered.reserve(buffer_.size() - drop);
    for (std::size_t i = drop; i < buffer_.size(); ++i) ordered.push_back(buffer_[(head_ + i) % buffer_.size()]);
    dropped_ += drop;
    buffer_ = std::move(ordered);
    head_ = 0;
    trim_notes_locked();
  }
  if (buffer_.capacity() < std::min(cap, kReserveRecords)) buffer_.reserve(std::min(cap, kReserveRecords));
}

void TraceRing::note_locked(const std::shared_ptr<const TraceNotes>& notes, std::uint64_t ordinal) {
  if (!notes_.empty() && notes_.back().notes == notes && notes_.back().last_ordinal + 1 == ordinal) {
    notes_.back().last_ordinal = ordinal;
  } else {
    notes_.push_back(NotesRun{notes, ordinal, ordinal});
  }
}

void TraceRing::grow_locked(const Slot& slot) { buffer_.push_back(slot); }

// The hot path of on_events: one store of the slot once the ring is full.
inline void TraceRing::append_locked(const alloc::AllocEvent& event, std::uint64_t ticks, std::uint32_t op,
                                     std::uint32_t scope, const std::shared_ptr<const TraceNotes>& notes,
                                     std::size_t cap) {
  const std::uint64_t ordinal = appended_++;
  if (notes != nullptr) [[unlikely]]
    note_locked(notes, ordinal);
  if (buffer_.size() < cap) [[unlikely]] {
    Slot slot{event, op, scope};
    slot.event.t_ns = ticks;
    grow_locked(slot);
    return;
  }
  // Full: overwrite the oldest record, one aligned line: the event's bytes copied as they are
  // (padding included, so the whole line is written), then the time, op and scope over them.
  Slot& slot = buffer_[head_];
  std::memcpy(static_cast<void*>(&slot.event), &event, sizeof event);
  slot.event.t_ns = ticks;
  slot.op = op;
  slot.scope = scope;
  if (++head_ == buffer_.size()) head_ = 0;
  // The slot the record after next overwrites was written a whole ring ago and has left the
  // caches; a store to a line that is not in the cache reads it from memory first, and the next
  // locked instruction (this lock's, the engine's) waits for that store. Asking for the line a few
  // records ahead, for writing, lets the read overlap with the program's own work.
  std::size_t ahead = head_ + kPrefetchAhead;
  if (ahead >= buffer_.size()) ahead %= buffer_.size();
  __builtin_prefetch(&buffer_[ahead], /*for writing*/ 1, /*keep in all levels*/ 3);
  ++dropped_;
  if (!notes_.empty() && notes_.front().last_ordinal < appended_ - buffer_.size()) [[unlikely]]
    trim_notes_locked();
}

void TraceRing::on_events(std::span<const alloc::AllocEvent> events) {
  if (!active()) return;
  // The allocation's stack context, read only while contexts are kept.
  const bool want_context = contexts_.load(std::memory_order_relaxed) || keep_contexts_.load(std::memory_order_relaxed);
  const std::shared_ptr<void>* context = want_context ? &AllocContext::current() : nullptr;
  if (context != nullptr && *context == nullptr) context = nullptr;
  std::uint32_t op = 0, scope = 0;
  if (record_ops_.load(std::memory_order_relaxed) || OpStack::switched_on()) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  const std::uint64_t ticks = detail::read_ticks();  // one time for the batch: one engine call
  // The common case (no hooks, nothing attached to the records): each event a few plain stores
  // into its slot under the lock, and nothing else.
  if (context == nullptr) {
    std::lock_guard lock(mutex_);
    if (hooks_.empty() && current_notes_ == nullptr) {
      const std::size_t cap = capacity_locked();
      for (const auto& event : events) {
        if (event.kind == alloc::EventKind::oom && oom_to_caller_) [[unlikely]] {
          t_held_oom = HeldOom{this, event};  // record_oom() keeps it, with the provider's free bytes
          continue;
        }
        if (floor_ == 0 && skipped_locked(event.kind)) continue;  // nobody keeps this kind
        if (cap != 0) append_locked(event, ticks, op, scope, kNoNotes, cap);
      }
      return;
    }
  }
  publish_slow(events, context, op, scope, ticks);
}

// on_events with hooks to call or notes to attach (a history with contexts, metadata, compile
// contexts): the records are built under the lock and handed to the hooks after it.
void TraceRing::publish_slow(std::span<const alloc::AllocEvent> events, const std::shared_ptr<void>* context,
                             std::uint32_t op, std::uint32_t scope, std::uint64_t ticks) {
  std::vector<Hook> hooks;
  std::vector<TraceRecord> for_hooks;
  {
    std::lock_guard lock(mutex_);
    // Alloc records carry the stack context the adapter gathered for this call (one allocation
    // per batch, only while contexts are kept).
    std::shared_ptr<const TraceNotes> with_context;
    if (context != nullptr && (settings_.contexts || keep_contexts_.load(std::memory_order_relaxed))) {
      auto notes = std::make_shared<TraceNotes>(current_notes_ ? *current_notes_ : TraceNotes{});
      notes->stack_context = *context;
      with_context = std::move(notes);
    }
    const std::size_t cap = capacity_locked();
    const bool any_hooks = !hooks_.empty();
    for (const auto& event : events) {
      if (event.kind == alloc::EventKind::oom && oom_to_caller_) {
        t_held_oom = HeldOom{this, event};  // record_oom() keeps it, with the provider's free bytes
        continue;
      }
      const bool skipped = skipped_locked(event.kind);
      if (skipped && floor_ == 0) continue;  // nobody keeps this kind
      const std::shared_ptr<const TraceNotes>& notes =
          event.kind == alloc::EventKind::alloc && with_context != nullptr ? with_context : current_notes_;
      if (!skipped && any_hooks) for_hooks.push_back(TraceRecord{event, op, scope, notes});
      if (cap != 0) append_locked(event, ticks, op, scope, notes, cap);
    }
    if (!for_hooks.empty()) hooks = hooks_;
  }
  if (for_hooks.empty()) return;
  const std::uint64_t now_ns = clock_.converter().to_steady_ns(ticks);
  for (auto& record : for_hooks) {
    record.event.t_ns = now_ns;
    for (const auto& hook : hooks) hook(record);
  }
}

void TraceRing::set_thread_context(std::shared_ptr<void> context) noexcept { AllocContext::set(std::move(context)); }

void TraceRing::record_oom(const alloc::AllocEvent& fallback, std::size_t device_free_bytes) {
  alloc::AllocEvent event = fallback;
  if (t_held_oom.ring == this) {
    event = t_held_oom.event;
    t_held_oom = HeldOom{};
  }
  if (!active()) return;
  std::uint32_t op = 0, scope = 0;
  if (record_ops_.load(std::memory_order_relaxed) || OpStack::switched_on()) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  const std::uint64_t ticks = detail::read_ticks();
  std::vector<Hook> hooks;
  TraceRecord record;
  {
    std::lock_guard lock(mutex_);
    const bool skipped = skipped_locked(event.kind);
    if (skipped && floor_ == 0) return;  // nobody keeps this kind
    auto notes = std::make_shared<TraceNotes>(current_notes_ ? *current_notes_ : TraceNotes{});
    notes->device_free_bytes = device_free_bytes;
    if (settings_.contexts || keep_contexts_.load(std::memory_order_relaxed)) notes->stack_context = AllocContext::current();
    record = TraceRecord{event, op, scope, std::move(notes)};
    if (!skipped) hooks = hooks_;
    const std::size_t cap = capacity_locked();
    if (cap != 0) append_locked(record.event, ticks, op, scope, record.notes, cap);
  }
  record.event.t_ns = clock_.converter().to_steady_ns(ticks);
  for (const auto& hook : hooks) hook(record);
}

template <class Keep>
std::vector<TraceRecord> TraceRing::copy_out_locked(std::size_t first, Keep keep) const {
  std::vector<TraceRecord> out;
  out.reserve(buffer_.size() - std::min(first, buffer_.size()));
  const std::uint64_t oldest = oldest_ordinal_locked();
  const detail::TickCalibration::Converter to_ns = clock_.converter();
  auto run = notes_.begin();
  for (std::size_t i = first; i < buffer_.size(); ++i) {
    const Slot& s = buffer_[(head_ + i) % buffer_.size()];
    if (!keep(s)) continue;
    TraceRecord r{s.event, s.op, s.scope, nullptr};
    r.event.t_ns = to_ns.to_steady_ns(s.event.t_ns);
    // Runs are in record order: the record's, if any, is the first that ends at or after it.
    const std::uint64_t ordinal = oldest + i;
    while (run != notes_.end() && run->last_ordinal < ordinal) ++run;
    if (run != notes_.end() && run->first_ordinal <= ordinal) r.notes = run->notes;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<TraceRecord> TraceRing::records() const {
  std::lock_guard lock(mutex_);
  return copy_out_locked(0, [](const Slot&) { return true; });
}

std::vector<TraceRecord> TraceRing::history() const {
  std::lock_guard lock(mutex_);
  if (settings_.capacity == 0) return {};
  const std::uint64_t oldest = oldest_ordinal_locked();
  const std::size_t first = history_start_ > oldest ? static_cast<std::size_t>(history_start_ - oldest) : 0;
  std::vector<TraceRecord> out =
      copy_out_locked(first, [this](const Slot& s) { return !skipped_locked(s.event.kind); });
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
