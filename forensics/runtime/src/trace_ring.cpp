#include "gpumem/forensics/trace_ring.h"

#include <algorithm>

#include "gpumem/forensics/error.h"
#include "gpumem/forensics/op_attribution.h"

namespace gpumem::forensics {

TraceRing::TraceRing(std::size_t capacity, bool record_ops) : record_ops_(record_ops) {
  if (capacity == 0) {
    throw ForensicsError("a trace ring needs a capacity of at least 1 record (trace_entries:0 turns tracing off: "
                         "do not create the ring then)");
  }
  ring_.resize(capacity);
}

void TraceRing::on_events(std::span<const alloc::AllocEvent> events) {
  std::uint32_t op = 0, scope = 0;
  if (record_ops_) {
    op = OpStack::current_op();
    scope = OpStack::current_scope();
  }
  std::lock_guard lock(mutex_);
  for (const auto& e : events) {
    ring_[head_] = TraceRecord{e, op, scope};
    head_ = head_ + 1 == ring_.size() ? 0 : head_ + 1;
    if (count_ < ring_.size()) {
      ++count_;
    } else {
      ++dropped_;
    }
  }
}

std::vector<TraceRecord> TraceRing::records() const {
  std::lock_guard lock(mutex_);
  std::vector<TraceRecord> out;
  out.reserve(count_);
  const std::size_t start = (head_ + ring_.size() - count_) % ring_.size();
  for (std::size_t i = 0; i < count_; ++i) out.push_back(ring_[(start + i) % ring_.size()]);
  return out;
}

std::size_t TraceRing::size() const {
  std::lock_guard lock(mutex_);
  return count_;
}

std::uint64_t TraceRing::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

void TraceRing::clear() {
  std::lock_guard lock(mutex_);
  head_ = count_ = 0;
  dropped_ = 0;
}

}  // namespace gpumem::forensics
