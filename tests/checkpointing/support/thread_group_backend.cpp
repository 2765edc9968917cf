#include "thread_group_backend.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <thread>

namespace gpumem::zero::testing {
namespace {

using Clock = std::chrono::steady_clock;

// The Work of one rank in one slot: complete when the slot is done.
class ThreadWork final : public c10d::Work {
 public:
  ThreadWork(std::shared_ptr<ThreadGroup> group, std::shared_ptr<ThreadGroup::Slot> slot, int rank,
             c10d::OpType op)
      : c10d::Work(rank, op), group_(std::move(group)), slot_(std::move(slot)), rank_of_(rank) {}

  bool isCompleted() override {
    return group_->is_done(*slot_) || group_->abort_reason().has_value();
  }
  bool isSuccess() const override { return group_->is_done(*slot_); }
  std::exception_ptr exception() const override {
    if (group_->is_done(*slot_)) return nullptr;
    auto reason = group_->abort_reason();
    return reason ? std::make_exception_ptr(std::runtime_error(*reason)) : nullptr;
  }
  bool wait(std::chrono::milliseconds timeout) override {
    group_->wait(slot_, rank_of_, timeout);
    return true;
  }
  void synchronize() override {}

 private:
  std::shared_ptr<ThreadGroup> group_;
  std::shared_ptr<ThreadGroup::Slot> slot_;
  int rank_of_;
};

std::string shape_of(const at::Tensor& t) {
  return fmt::format("{}[{}]", c10::toString(t.scalar_type()), t.numel());
}

void check_tensor(const at::Tensor& t, const char* what, const char* role) {
  if (!t.defined() || !t.device().is_cpu() || !t.is_contiguous()) {
    throw std::invalid_argument(fmt::format(
        "ThreadBackend {}: the {} must be a defined, contiguous CPU tensor (this test double "
        "runs on CPU only)",
        what, role));
  }
}

bool is_avg(const c10d::ReduceOp& op, const char* what) {
  using R = c10d::ReduceOp::RedOpType;
  if (op.op_ == R::SUM) return false;
  if (op.op_ == R::AVG) return true;
  throw std::invalid_argument(fmt::format(
      "ThreadBackend {}: reduce op {} is not implemented (the test double implements SUM and AVG, "
      "what ShardedTrainer uses)",
      what, static_cast<int>(op.op_)));
}

// Sum (or mean) of every rank's tensor `index`, in double, in rank order.
at::Tensor reduce_inputs(const ThreadGroup::Slot& slot, bool average) {
  at::Tensor acc = slot.inputs[0][0].to(at::kDouble, /*non_blocking=*/false, /*copy=*/true);
  for (std::size_t r = 1; r < slot.inputs.size(); ++r) acc.add_(slot.inputs[r][0].to(at::kDouble));
  if (average) acc.div_(static_cast<double>(slot.inputs.size()));
  return acc;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// ThreadGroup

ThreadGroup::ThreadGroup(int world_size, std::chrono::milliseconds timeout)
    : world_size_(world_size), timeout_(timeout) {}

std::shared_ptr<ThreadGroup> ThreadGroup::create(int world_size,
                                                 std::chrono::milliseconds timeout) {
  if (world_size < 1) throw std::invalid_argument("ThreadGroup: world size must be at least 1");
  return std::shared_ptr<ThreadGroup>(new ThreadGroup(world_size, timeout));
}

c10::intrusive_ptr<c10d::Backend> ThreadGroup::backend(int rank) {
  if (rank < 0 || rank >= world_size_) {
    throw std::invalid_argument(
        fmt::format("ThreadGroup: rank {} outside 0..{}", rank, world_size_ - 1));
  }
  return c10::make_intrusive<ThreadBackend>(shared_from_this(), rank);
}

void ThreadGroup::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  abort_locked(reason);
}

void ThreadGroup::abort_locked(const std::string& reason) {
  if (!abort_reason_) abort_reason_ = reason;
  cv_.notify_all();
}

std::optional<std::string> ThreadGroup::abort_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

std::uint64_t ThreadGroup::completed_collectives() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_;
}

bool ThreadGroup::is_done(const Slot& slot) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return slot.done;
}

void ThreadGroup::throw_aborted_locked(int rank, const std::string& what) const {
  throw std::runtime_error(fmt::format("thread group aborted; rank {}'s {} failed because {}", rank,
                                       what, *abort_reason_));
}

std::shared_ptr<ThreadGroup::Slot> ThreadGroup::arrive(int rank, std::uint64_t seq,
                                                       const std::string& signature,
                                                       std::vector<at::Tensor> inputs,
                                                       std::vector<at::Tensor> outputs,
                                                       Compute compute) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string what = fmt::format("collective #{} {}", seq, signature);
  if (abort_reason_) throw_aborted_locked(rank, what);
  std::shared_ptr<Slot>& entry = open_slots_[seq];
  if (!entry) {
    entry = std::make_shared<Slot>();
    entry->seq = seq;
    entry->signature = signature;
    entry->first_rank = rank;
    entry->present.assign(world_size_, false);
    entry->inputs.resize(world_size_);
    entry->outputs.resize(world_size_);
    entry->compute = std::move(compute);
  } else if (entry->signature != signature) {
    abort_locked(fmt::format("collective #{} mismatch: rank {} called {} but rank {} called {}",
                             seq, entry->first_rank, entry->signature, rank, signature));
    throw_aborted_locked(rank, what);
  }
  std::shared_ptr<Slot> slot = entry;
  slot->present[rank] = true;
  slot->inputs[rank] = std::move(inputs);
  slot->outputs[rank] = std::move(outputs);
  if (++slot->arrived < world_size_) return slot;

  // Last to arrive: compute for everyone, outside the lock.
  open_slots_.erase(seq);
  lock.unlock();
  std::string failure;
  try {
    slot->compute(*slot);
  } catch (const std::exception& e) {
    failure = fmt::format("{} failed while computing: {}", what, e.what());
  }
  lock.lock();
  if (!failure.empty()) {
    abort_locked(failure);
    throw_aborted_locked(rank, what);
  }
  slot->done = true;
  slot->inputs.clear();  // drop the references to every rank's tensors
  slot->outputs.clear();
  ++completed_;
  cv_.notify_all();
  return slot;
}

void ThreadGroup::wait(const std::shared_ptr<Slot>& slot, int rank,
                       std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto limit = timeout.count() > 0 ? timeout : timeout_;
  const auto deadline = Clock::now() + limit;
  while (!slot->done && !abort_reason_) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !slot->done &&
        !abort_reason_) {
      std::vector<int> missing;
      for (int r = 0; r < world_size_; ++r) {
        if (!slot->present[r]) missing.push_back(r);
      }
      abort_locked(fmt::format(
          "rank {} timed out after {} ms in collective #{} {}: rank(s) {} never arrived", rank,
          limit.count(), slot->seq, slot->signature, fmt::join(missing, ", ")));
    }
  }
  if (slot->done) return;
  throw_aborted_locked(rank, fmt::format("collective #{} {}", slot->seq, slot->signature));
}

// ---------------------------------------------------------------------------------------------
// ThreadBackend

ThreadBackend::ThreadBackend(std::shared_ptr<ThreadGroup> group, int rank)
    : c10d::Backend(rank, group->world_size()), group_(std::move(group)) {}

c10::intrusive_ptr<c10d::Work> ThreadBackend::submit(c10d::OpType op, const std::string& name,
                                                     const std::string& signature,
                                                     std::vector<at::Tensor> inputs,
                                                     std::vector<at::Tensor> outputs,
                                                     ThreadGroup::Compute compute) {
  ++issued_[name];
  auto slot = group_->arrive(getRank(), next_seq_++, signature, std::move(inputs),
                             std::move(outputs), std::move(compute));
  return c10::make_intrusive<ThreadWork>(group_, std::move(slot), getRank(), op);
}

c10::intrusive_ptr<c10d::Work> ThreadBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                        const c10d::BroadcastOptions& opts) {
  if (tensors.size() != 1)
    throw std::invalid_argument("ThreadBackend broadcast: exactly one tensor");
  check_tensor(tensors[0], "broadcast", "tensor");
  if (opts.rootRank < 0 || opts.rootRank >= getSize()) {
    throw std::invalid_argument(
        fmt::format("ThreadBackend broadcast: root {} outside the group", opts.rootRank));
  }
  const int root = static_cast<int>(opts.rootRank);
  const std::string sig = fmt::format("broadcast({}, root {})", shape_of(tensors[0]), root);
  return submit(c10d::OpType::BROADCAST, "broadcast", sig, {tensors[0]}, {tensors[0]},
                [root](ThreadGroup::Slot& s) {
                  const at::Tensor source = s.inputs[root][0].clone();
                  for (auto& out : s.outputs) out[0].copy_(source);
                });
}

c10::intrusive_ptr<c10d::Work> ThreadBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                        const c10d::AllreduceOptions& opts) {
  if (tensors.size() != 1)
    throw std::invalid_argument("ThreadBackend allreduce: exactly one tensor");
  check_tensor(tensors[0], "allreduce", "tensor");
  const bool average = is_avg(opts.reduceOp, "allreduce");
  const std::string sig =
      fmt::format("allreduce({}, {})", shape_of(tensors[0]), average ? "AVG" : "SUM");
  return submit(c10d::OpType::ALLREDUCE, "allreduce", sig, {tensors[0]}, {tensors[0]},
                [average](ThreadGroup::Slot& s) {
                  const at::Tensor result = reduce_inputs(s, average);
                  for (auto& out : s.outputs) out[0].copy_(result);
                });
}

c10::intrusive_ptr<c10d::Work> ThreadBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                              const c10d::AllgatherOptions&) {
  check_tensor(output, "_allgather_base", "output");
  check_tensor(input, "_allgather_base", "input");
  if (output.numel() != input.numel() * getSize() || output.scalar_type() != input.scalar_type()) {
    throw std::invalid_argument(fmt::format(
        "ThreadBackend _allgather_base: output {} must be world size ({}) times input {}",
        shape_of(output), getSize(), shape_of(input)));
  }
  const std::string sig =
      fmt::format("_allgather_base({} -> {})", shape_of(input), shape_of(output));
  return submit(c10d::OpType::_ALLGATHER_BASE, "_allgather_base", sig, {input}, {output},
                [](ThreadGroup::Slot& s) {
                  // Gather every input first: an input may be a slice of its own rank's output.
                  std::vector<at::Tensor> parts;
                  for (auto& in : s.inputs) parts.push_back(in[0].reshape(-1).clone());
                  const at::Tensor all = at::cat(parts);
                  for (auto& out : s.outputs) out[0].view(-1).copy_(all);
                });
}

c10::intrusive_ptr<c10d::Work> ThreadBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  check_tensor(output, "_reduce_scatter_base", "output");
  check_tensor(input, "_reduce_scatter_base", "input");
  if (input.numel() != output.numel() * getSize() || output.scalar_type() != input.scalar_type()) {
    throw std::invalid_argument(fmt::format(
        "ThreadBackend _reduce_scatter_base: input {} must be world size ({}) times output {}",
        shape_of(input), getSize(), shape_of(output)));
  }
  const bool average = is_avg(opts.reduceOp, "_reduce_scatter_base");
  const std::string sig = fmt::format("_reduce_scatter_base({} -> {}, {})", shape_of(input),
                                      shape_of(output), average ? "AVG" : "SUM");
  return submit(
      c10d::OpType::_REDUCE_SCATTER_BASE, "_reduce_scatter_base", sig, {input}, {output},
      [average](ThreadGroup::Slot& s) {
        const at::Tensor result = reduce_inputs(s, average).reshape(-1);
        const std::int64_t n = s.outputs[0][0].numel();
        for (std::size_t r = 0; r < s.outputs.size(); ++r) {
          s.outputs[r][0].view(-1).copy_(result.narrow(0, static_cast<std::int64_t>(r) * n, n));
        }
      });
}

c10::intrusive_ptr<c10d::Work> ThreadBackend::barrier(const c10d::BarrierOptions&) {
  return submit(c10d::OpType::BARRIER, "barrier", "barrier()", {}, {}, [](ThreadGroup::Slot&) {});
}

// ---------------------------------------------------------------------------------------------

std::vector<std::string> run_ranks(
    int world_size, const std::function<void(int, c10::intrusive_ptr<c10d::Backend>)>& fn,
    std::chrono::milliseconds timeout) {
  auto group = ThreadGroup::create(world_size, timeout);
  std::vector<std::string> errors(world_size);
  std::vector<std::thread> threads;
  threads.reserve(world_size);
  for (int r = 0; r < world_size; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r, group->backend(r));
      } catch (const std::exception& e) {
        errors[r] = e.what();
        group->abort(fmt::format("rank {} failed: {}", r, e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

}  // namespace gpumem::zero::testing
