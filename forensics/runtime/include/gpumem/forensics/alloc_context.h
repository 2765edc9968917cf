// AllocContext: what the program says about the allocation the calling thread is making, for the
// observers of that call's events: an opaque stack context (the torch adapter's
// c10::GatheredContext: a torch::CapturedTraceback with the Python stack, gathered before the
// engine call). Engines publish a call's events on the calling thread before the call returns, so
// the trace ring and the fragmentation tracker read the context current on that thread.
//
//   {
//     AllocContext::Scope scope(gather_stack());   // null = nothing attached
//     engine.allocate(...);                         // observers see current() == that context
//   }
//
// Thread-safety: thread-local by construction; a Scope restores the previous context when it
// ends, so scopes nest.
#pragma once

#include <memory>

namespace gpumem::forensics {

class AllocContext {
 public:
  // The context of the calling thread's allocation in progress (null when none).
  static const std::shared_ptr<void>& current() noexcept;
  // Sets the calling thread's context without a scope (the caller clears it after the call, as
  // the torch adapter does around engine->allocate).
  static void set(std::shared_ptr<void> context) noexcept;

  class Scope {
   public:
    explicit Scope(std::shared_ptr<void> context) noexcept;
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    std::shared_ptr<void> previous_;
  };
};

}  // namespace gpumem::forensics
