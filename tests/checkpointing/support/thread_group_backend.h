// ThreadGroup / ThreadBackend: a c10d Backend that runs N ranks as threads of one process.
//
// A test double, not a product feature: CI has no GPUs and the torch wheel ships no Gloo
// headers, so the ShardedTrainer tests run N ranks as threads (the pattern PyTorch's own
// threaded process-group tests use) and this backend carries their collectives. It implements
// exactly what the trainer uses: allreduce (SUM, AVG), _reduce_scatter_base (SUM, AVG),
// _allgather_base (in place or not), broadcast and barrier, on contiguous CPU tensors.
//
// Protocol. Each rank numbers its collectives 0, 1, 2, ...; the k-th collective of every rank
// meets in slot k. A rank arriving at a slot deposits its tensors and returns a Work at once
// (the collective is asynchronous); the last rank to arrive computes the result for everyone
// (reductions accumulate in double, in rank order, so results are deterministic), writes every
// rank's outputs and completes the slot. Callers must not touch a collective's tensors until its
// Work::wait() returns, as with any c10d backend.
//
// Failure. The group has one abort flag. It is raised by abort() (run_ranks() calls it when a
// rank's function throws), by a wait that exceeds the timeout (naming the ranks that never
// arrived), and by ranks calling different collectives in the same slot (naming both). Once
// raised, every waiting and every later collective throws std::runtime_error carrying the first
// reason, so all ranks fail with a clear error instead of hanging.
//
// Thread-safety: ThreadGroup is thread-safe (one mutex, one condition variable). Each
// ThreadBackend is used by its own rank's thread.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace gpumem::zero::testing {

class ThreadGroup : public std::enable_shared_from_this<ThreadGroup> {
 public:
  struct Slot;

  static std::shared_ptr<ThreadGroup> create(int world_size, std::chrono::milliseconds timeout);

  c10::intrusive_ptr<c10d::Backend> backend(int rank);
  int world_size() const { return world_size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // Raises the abort flag (the first reason wins) and wakes every waiter.
  void abort(const std::string& reason);
  std::optional<std::string> abort_reason() const;
  std::uint64_t completed_collectives() const;

  // Used by ThreadBackend. `signature` must be equal on every rank for the same slot;
  // `compute` runs once, on the last rank to arrive, with every rank's tensors.
  using Compute = std::function<void(Slot&)>;
  std::shared_ptr<Slot> arrive(int rank, std::uint64_t seq, const std::string& signature,
                               std::vector<at::Tensor> inputs, std::vector<at::Tensor> outputs,
                               Compute compute);
  void wait(const std::shared_ptr<Slot>& slot, int rank, std::chrono::milliseconds timeout);
  bool is_done(const Slot& slot) const;

  struct Slot {
    std::uint64_t seq = 0;
    std::string signature;  // of the first rank to arrive
    int first_rank = -1;
    int arrived = 0;
    std::vector<bool> present;
    std::vector<std::vector<at::Tensor>> inputs;   // by rank
    std::vector<std::vector<at::Tensor>> outputs;  // by rank
    Compute compute;
    bool done = false;
  };

 private:
  ThreadGroup(int world_size, std::chrono::milliseconds timeout);
  void abort_locked(const std::string& reason);
  [[noreturn]] void throw_aborted_locked(int rank, const std::string& what) const;

  const int world_size_;
  const std::chrono::milliseconds timeout_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::map<std::uint64_t, std::shared_ptr<Slot>> open_slots_;
  std::optional<std::string> abort_reason_;
  std::uint64_t completed_ = 0;
};

class ThreadBackend final : public c10d::Backend {
 public:
  ThreadBackend(std::shared_ptr<ThreadGroup> group, int rank);

  const std::string getBackendName() const override { return "gpumem-threads"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

  // How many collectives of each kind this rank issued (tests check what the trainer uses).
  std::map<std::string, int> issued() const { return issued_; }

 private:
  c10::intrusive_ptr<c10d::Work> submit(c10d::OpType op, const std::string& name,
                                        const std::string& signature,
                                        std::vector<at::Tensor> inputs,
                                        std::vector<at::Tensor> outputs,
                                        ThreadGroup::Compute compute);

  std::shared_ptr<ThreadGroup> group_;
  std::uint64_t next_seq_ = 0;
  std::map<std::string, int> issued_;
};

// Runs fn(rank, backend) for every rank on its own thread and joins them. A rank whose fn throws
// aborts the group, so the others fail instead of waiting forever. Returns each rank's error
// message ("" when it succeeded).
std::vector<std::string> run_ranks(
    int world_size, const std::function<void(int, c10::intrusive_ptr<c10d::Backend>)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace gpumem::zero::testing
