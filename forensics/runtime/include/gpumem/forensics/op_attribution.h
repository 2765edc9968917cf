// Op attribution: which op (aten::mm, a RECORD_FUNCTION block) and which user scope
// (torch.profiler.record_function, RECORD_USER_SCOPE) a thread is inside, so that observers can
// tag the allocator's events with them.
//
// OpRegistry interns names to small ids (0 = none) once; OpStack is a per-thread stack of ops and
// one of user scopes. Something pushes and pops them around each op: the at::RecordFunction
// callbacks of install_record_function_attribution() (op_attribution_torch.h, built with
// libtorch), or ScopedOp in code that calls the allocator directly. Allocator calls run
// synchronously on the calling thread inside the op, so the top of the calling thread's stacks
// names the op an event belongs to.
//
// Most ops allocate nothing, so a push costs two stores: push_name() keeps the name's pointer,
// which must stay valid until the matching pop (RecordFunction's names do: the op's schema, or a
// string the RecordFunction owns while it runs). The name is interned only when an event asks
// for the op (current_op()), once per push, through a small per-thread cache keyed by pointer and
// confirmed by content (a pointer may be reused for another name once its op ended).
//
// Invariants: ids are dense from 1 and never change meaning; a stack deeper than kMaxDepth keeps
// counting (push/pop stay balanced) and reports the deepest kept entry.
// Thread-safety: OpRegistry is safe from any thread (interning takes a lock, lookups of names a
// shared lock); OpStack is thread-local by construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace gpumem::forensics {

class OpRegistry {
 public:
  static OpRegistry& global();
  std::uint32_t intern(std::string_view name);
  std::string name(std::uint32_t id) const;  // "" for 0 or an unknown id
  std::size_t size() const;

  OpRegistry();
  ~OpRegistry();
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

class OpStack {
 public:
  static constexpr std::size_t kMaxDepth = 64;
  static void push_op(std::uint32_t id) noexcept;
  static void pop_op() noexcept;
  static void push_scope(std::uint32_t id) noexcept;
  static void pop_scope() noexcept;
  // By name, interned on first use (see above); a null or empty name is "none".
  static void push_op_name(const char* name) noexcept;
  static void push_scope_name(const char* name) noexcept;
  static std::uint32_t current_op() noexcept;     // 0 if none
  static std::uint32_t current_scope() noexcept;  // 0 if none
  static std::size_t op_depth() noexcept;

  // Whether op attribution was switched on while the process runs (the RecordFunction callbacks
  // enabled through set_record_function_attribution / install_record_function_attribution):
  // observers configured without record_ops then tag their events too, so the run-time switch
  // works whatever the configuration said. A relaxed load; set by the switch only.
  static bool switched_on() noexcept;
  static void set_switched_on(bool on) noexcept;
};

// Pushes an op (or a user scope) for the lifetime of the object.
class ScopedOp {
 public:
  explicit ScopedOp(std::string_view name, bool user_scope = false);
  ~ScopedOp();
  ScopedOp(const ScopedOp&) = delete;
  ScopedOp& operator=(const ScopedOp&) = delete;

 private:
  bool user_scope_;
};

}  // namespace gpumem::forensics
