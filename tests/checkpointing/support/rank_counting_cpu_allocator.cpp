#include "rank_counting_cpu_allocator.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

namespace gpumem::zero::testing {
namespace {

thread_local int current_rank = -1;
constexpr std::uint8_t kPriority = 200;  // above c10's default registration

}  // namespace

RankCountingCpuAllocator& RankCountingCpuAllocator::instance() {
  static RankCountingCpuAllocator* a = new RankCountingCpuAllocator();  // outlives every tensor
  return *a;
}

void RankCountingCpuAllocator::install() {
  if (installed_) return;
  c10::Allocator* current = c10::GetCPUAllocator();
  if (base_ == nullptr) {
    base_ = current;
    base_deleter_ = current->raw_deleter();
    TORCH_CHECK(base_deleter_ != nullptr,
                "RankCountingCpuAllocator wraps allocators whose memory a raw deleter frees");
  }
  if (current != this) c10::SetCPUAllocator(this, kPriority);
  installed_ = true;
}

void RankCountingCpuAllocator::uninstall() {
  if (!installed_) return;
  c10::SetCPUAllocator(base_, kPriority);
  installed_ = false;
}

std::int64_t RankCountingCpuAllocator::live_bytes(int rank) const { return live_.at(rank).load(); }
std::int64_t RankCountingCpuAllocator::peak_bytes(int rank) const { return peak_.at(rank).load(); }
void RankCountingCpuAllocator::reset_peak(int rank) { peak_.at(rank).store(live_.at(rank).load()); }

RankCountingCpuAllocator::RankTag::RankTag(int rank) : previous_(current_rank) {
  TORCH_CHECK(rank >= 0 && rank < kMaxRanks, "RankTag: rank ", rank, " outside 0..", kMaxRanks - 1);
  current_rank = rank;
}

RankCountingCpuAllocator::RankTag::~RankTag() { current_rank = previous_; }

void RankCountingCpuAllocator::charge(int rank, std::int64_t bytes) {
  if (rank < 0) return;
  const std::int64_t now = live_[rank].fetch_add(bytes) + bytes;
  std::int64_t peak = peak_[rank].load();
  while (now > peak && !peak_[rank].compare_exchange_weak(peak, now)) {
  }
}

c10::DataPtr RankCountingCpuAllocator::allocate(std::size_t bytes) {
  TORCH_INTERNAL_ASSERT(base_ != nullptr, "RankCountingCpuAllocator used before install()");
  c10::DataPtr inner = base_->allocate(bytes);
  void* data = inner.get();
  if (data == nullptr) return inner;  // zero bytes: nothing to charge
  TORCH_INTERNAL_ASSERT(inner.get_context() == data && inner.get_deleter() == base_deleter_,
                        "the wrapped CPU allocator's memory is not freed by its raw deleter");
  const c10::Device device = inner.device();
  inner.release_context();  // freed by free_charged from now on
  {
    std::lock_guard<std::mutex> lock(mutex_);
    charges_[data] = Charge{static_cast<std::int64_t>(bytes), current_rank};
  }
  charge(current_rank, static_cast<std::int64_t>(bytes));
  return c10::DataPtr(data, data, &RankCountingCpuAllocator::free_charged, device);
}

void RankCountingCpuAllocator::free_charged(void* data) {
  RankCountingCpuAllocator& self = instance();
  Charge c{0, -1};
  {
    std::lock_guard<std::mutex> lock(self.mutex_);
    // Memory from before install() can come back through raw_deallocate() of the allocator in
    // place now (kernels keep scratch buffers): it was never charged and goes straight back.
    auto it = self.charges_.find(data);
    if (it != self.charges_.end()) {
      c = it->second;
      self.charges_.erase(it);
    }
  }
  self.charge(c.rank, -c.bytes);
  self.base_deleter_(data);
}

void RankCountingCpuAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  default_copy_data(dest, src, count);
}

}  // namespace gpumem::zero::testing
