// TickClock: the cheapest monotonic time stamp this CPU offers, for the observers that stamp
// every allocator event (the trace ring, the fragmentation tracker), and the conversion of its
// ticks into the steady clock's nanoseconds when records are read.
//
// Why not the steady clock: on virtual machines whose clock source is not the time-stamp counter
// (common on cloud GPU hosts), every std::chrono::steady_clock::now() is a system call costing
// about a microsecond, more than the rest of an allocation; PyTorch's allocator history stamps
// its entries with the counter for the same reason (c10::getApproximateTime). Reading the
// counter costs a few nanoseconds everywhere.
//
//   x86-64   the time-stamp counter (rdtsc): invariant on every CPU a GPU host has
//   AArch64  the virtual counter (cntvct_el0)
//   other    the steady clock itself (ticks are nanoseconds)
//
// TickCalibration remembers one (ticks, steady ns) pair taken when it was made; converter() takes
// a second pair and maps ticks linearly between them (and beyond, at the same rate). Converting
// records taken long before the read is exact to the counter's stability (parts per million);
// right after construction, when the two pairs are microseconds apart, the rate is taken as
// measured over at least kMinSpanNs.
//
// Thread-safety: read_ticks() and TickCalibration are safe from any thread (a calibration is
// immutable after construction; a Converter is a value).
#pragma once

#include <chrono>
#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64)
#include <x86intrin.h>
#endif

namespace gpumem::forensics::detail {

inline std::uint64_t steady_ns() noexcept {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

inline std::uint64_t read_ticks() noexcept {
#if defined(__x86_64__) || defined(_M_X64)
  return __rdtsc();
#elif defined(__aarch64__)
  std::uint64_t v;
  asm volatile("mrs %0, cntvct_el0" : "=r"(v));
  return v;
#else
  return steady_ns();
#endif
}

class TickCalibration {
 public:
  TickCalibration() noexcept : ticks0_(read_ticks()), ns0_(steady_ns()) {}

  class Converter {
   public:
    std::uint64_t to_steady_ns(std::uint64_t ticks) const noexcept {
      const double d = static_cast<double>(static_cast<std::int64_t>(ticks - ticks0_)) * ns_per_tick_;
      return static_cast<std::uint64_t>(static_cast<std::int64_t>(ns0_) + static_cast<std::int64_t>(d));
    }

   private:
    friend class TickCalibration;
    std::uint64_t ticks0_ = 0;
    std::uint64_t ns0_ = 0;
    double ns_per_tick_ = 1.0;
  };

  // A converter calibrated over [construction, now].
  Converter converter() const noexcept {
    Converter c;
    c.ticks0_ = ticks0_;
    c.ns0_ = ns0_;
#if defined(__x86_64__) || defined(_M_X64) || defined(__aarch64__)
    std::uint64_t ticks1 = read_ticks();
    std::uint64_t ns1 = steady_ns();
    if (ns1 - ns0_ < kMinSpanNs) {
      // Too short to measure the rate: wait until the span is long enough (only right after
      // construction; a read of a ring that was just made).
      while (ns1 - ns0_ < kMinSpanNs) ns1 = steady_ns();
      ticks1 = read_ticks();
    }
    c.ns_per_tick_ = ticks1 > ticks0_ ? static_cast<double>(ns1 - ns0_) / static_cast<double>(ticks1 - ticks0_) : 1.0;
#endif
    return c;
  }

 private:
  static constexpr std::uint64_t kMinSpanNs = 200'000;  // 0.2 ms: rate known to 1e-3 at worst
  std::uint64_t ticks0_;
  std::uint64_t ns0_;
};

}  // namespace gpumem::forensics::detail
