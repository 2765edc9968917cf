// ForwardingSource: the base of a MemorySource decorator, a source that wraps another to count,
// time, cap or trace its calls. It passes every call to the inner source, now_ns included: a
// decorator that overrides none behaves as its inner source does, and one that overrides a few
// forwards the rest. A call MemorySource gains is forwarded here once, not in every decorator.
//
// What an override keeps:
//   * To reach the inner source it calls the base's function (ForwardingSource::create(...)), or
//     its own reference to the inner source where it holds one of a concrete type; never the
//     virtual (create() inside create() recurses, and inside another override goes through this
//     decorator's create again).
//   * now_ns is the inner source's clock unless overridden: a decorator that must keep the steady
//     clock (MemorySource's default) whatever it wraps returns MemorySource::now_ns().
//   * MemorySource's contract: caps() stays noexcept, and state the decorator adds is guarded, as
//     several threads may call it.
//
// The inner source must outlive the decorator. A decorator that owns it (a member, a unique_ptr)
// may pass it to this constructor before its member is built or takes it over: the constructor only
// binds the reference.
//
// Thread-safety: what the inner source's calls are; ForwardingSource holds nothing else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gpumem/alloc/memory_source.h"

namespace gpumem::alloc {

class ForwardingSource : public MemorySource {
 public:
  explicit ForwardingSource(MemorySource& inner) noexcept : inner_(inner) {}

  SourceCaps caps() const noexcept override { return inner_.caps(); }
  SourceResult<VaRange> reserve(std::size_t size_bytes, std::size_t alignment_bytes) override {
    return inner_.reserve(size_bytes, alignment_bytes);
  }
  SourceStatus release(VaRange range) override { return inner_.release(range); }
  SourceResult<PhysHandle> create(std::size_t size_bytes) override { return inner_.create(size_bytes); }
  SourceStatus destroy(PhysHandle handle) override { return inner_.destroy(handle); }
  SourceStatus map(std::uintptr_t va, std::size_t size_bytes, PhysHandle handle) override {
    return inner_.map(va, size_bytes, handle);
  }
  SourceStatus unmap(std::uintptr_t va, std::size_t size_bytes) override { return inner_.unmap(va, size_bytes); }
  ProviderMemInfo mem_info() const override { return inner_.mem_info(); }
  std::string last_error() const override { return inner_.last_error(); }
  std::int64_t now_ns() const override { return inner_.now_ns(); }

 private:
  MemorySource& inner_;
};

}  // namespace gpumem::alloc
