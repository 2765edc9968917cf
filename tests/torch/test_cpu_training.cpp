// gpumem as libtorch's CPU allocator (install_cpu), end to end: tensors of known sizes move the
// statistics by exactly what they are; a small GPT-style training run allocates and frees what
// the profiler's memory hooks see, with the same peak as under c10's own CPU allocator; a
// snapshot taken mid-run agrees with the statistics; and everything is freed at the end.
//
// Test cases run in name order (--order lex); "cpu 9" checks the state the others leave.
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "catch.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"
#include "gpumem/toy/gpt.h"

namespace {

const c10::Device kCpu(c10::DeviceType::CPU);

void ensure_installed() {
  static const bool done = [] {
    torch::set_num_threads(1);  // one thread: the profiler hooks below are thread-local
    gpumem::torch::install_cpu();
    return true;
  }();
  (void)done;
  if (!gpumem::torch::cpu_installed()) gpumem::torch::install_cpu();
}

std::size_t round512(std::size_t n) { return (n + 511) / 512 * 512; }

// What the profiler sees: c10's allocators report every CPU allocation and free to the
// MemoryReportingInfoBase in this thread's PROFILER_STATE slot.
struct Ledger final : c10::MemoryReportingInfoBase {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocs = 0;
  std::int64_t frees = 0;
  std::int64_t total_allocated_bytes = 0;

  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (!device.is_cpu() || size == 0) return;
    current += size;
    peak = std::max(peak, current);
    if (size > 0) {
      ++allocs;
      total_allocated_bytes += size;
    } else {
      ++frees;
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

// The model: gpumem::toy::Gpt with one pre-norm block (causal attention via
// scaled_dot_product_attention, 4x MLP) and an LM head with a bias.
const gpumem::toy::GptOptions kTinyGpt{.layers = 1, .width = 32, .heads = 4, .vocab = 64, .max_seq = 64,
                                       .head_bias = true};

// Trains for `steps` steps with a sequence length that changes every step; returns the losses.
std::vector<double> train(int steps, const std::function<void(int)>& after_step = {}) {
  torch::manual_seed(7);
  gpumem::toy::Gpt model(kTinyGpt);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    const int64_t seq = 8 + (step * 13) % 40;
    auto start = torch::randint(kTinyGpt.vocab, {4, 1}, torch::kLong);
    auto tokens = (start + 3 * torch::arange(seq + 1, torch::kLong).unsqueeze(0)) % kTinyGpt.vocab;
    auto input = tokens.slice(1, 0, seq), target = tokens.slice(1, 1, seq + 1);
    auto logits = model->forward(input);
    auto loss = torch::nn::functional::cross_entropy(logits.reshape({-1, kTinyGpt.vocab}), target.reshape({-1}));
    optimizer.zero_grad();
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
    if (after_step) after_step(step);
  }
  return losses;
}

}  // namespace

TEST_CASE("cpu 1: install_cpu makes gpumem c10's CPU allocator, idempotently") {
  ensure_installed();
  CHECK(gpumem::torch::cpu_installed());
  CHECK(gpumem::torch::engine(kCpu) != nullptr);
  gpumem::torch::install_cpu();  // same configuration: no-op
  {
    auto t = torch::empty({1000}, torch::kFloat);
    REQUIRE(gpumem::torch::engine(kCpu)->lookup(t.data_ptr()).has_value());
    CHECK(reinterpret_cast<std::uintptr_t>(t.data_ptr()) % 512 == 0);
  }
  gpumem::torch::Config other;
  other.engine.expandable_segments = false;
  std::string message;
  try {
    gpumem::torch::install_cpu(other);
  } catch (const c10::Error& e) {
    message = e.what_without_backtrace();
  }
  CHECK(message.find("already exists with configuration") != std::string::npos);
}

TEST_CASE("cpu 2: statistics move by exactly the tensors allocated and freed") {
  ensure_installed();
  const auto before = gpumem::torch::cpu_stats();
  const std::vector<int64_t> numels{1, 100, 128, 1000, 4096, 262144, 262145, 3 * 262144 + 7, 5000000};
  std::size_t rounded = 0, requested = 0, small_rounded = 0, large_rounded = 0;
  std::vector<torch::Tensor> tensors;
  for (auto n : numels) {
    tensors.push_back(torch::empty({n}, torch::kFloat));
    const std::size_t bytes = static_cast<std::size_t>(n) * 4;
    requested += bytes;
    rounded += round512(bytes);
    (bytes <= (std::size_t{1} << 20) ? small_rounded : large_rounded) += round512(bytes);
  }
  const auto during = gpumem::torch::cpu_stats();
  const auto n = static_cast<int64_t>(numels.size());
  CHECK(during.allocation[0].current - before.allocation[0].current == n);
  CHECK(during.allocated_bytes[0].current - before.allocated_bytes[0].current == static_cast<int64_t>(rounded));
  CHECK(during.requested_bytes[0].current - before.requested_bytes[0].current == static_cast<int64_t>(requested));
  CHECK(during.allocated_bytes[1].current - before.allocated_bytes[1].current == static_cast<int64_t>(small_rounded));
  CHECK(during.allocated_bytes[2].current - before.allocated_bytes[2].current == static_cast<int64_t>(large_rounded));
  CHECK(during.active_bytes[0].current - before.active_bytes[0].current == static_cast<int64_t>(rounded));
  CHECK(during.reserved_bytes[0].current >= during.allocated_bytes[0].current);
  CHECK(during.allocated_bytes[0].peak >= during.allocated_bytes[0].current);

  // The same numbers under torch.cuda.memory_stats()'s keys.
  const auto flat = gpumem::torch::memory_stats(kCpu);
  CHECK(flat.at("allocated_bytes.all.current") == during.allocated_bytes[0].current);
  CHECK(flat.at("requested_bytes.all.current") == during.requested_bytes[0].current);
  CHECK(flat.at("allocation.all.current") == during.allocation[0].current);

  // Writing every byte works (the memory is real) and data survives.
  for (std::size_t i = 0; i < tensors.size(); ++i) tensors[i].fill_(static_cast<float>(i));
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const double expected = double(i) * double(numels[i]);
    CHECK(std::abs(tensors[i].sum(torch::kDouble).item<double>() - expected) <= 1e-9 * expected);
  }

  tensors.clear();
  const auto after = gpumem::torch::cpu_stats();
  CHECK(after.allocation[0].current == before.allocation[0].current);
  CHECK(after.allocated_bytes[0].current == before.allocated_bytes[0].current);
  CHECK(after.requested_bytes[0].current == before.requested_bytes[0].current);
  CHECK(after.allocation[0].allocated - before.allocation[0].allocated >= n);
  CHECK(after.allocation[0].freed - before.allocation[0].freed >= n);
}

TEST_CASE("cpu 3: training allocates what the profiler sees, with c10's own allocator's peak") {
  ensure_installed();
  constexpr int kSteps = 6;
  train(2);  // warm-up: libtorch's one-time lazy allocations happen here

  // c10's default CPU allocator, seen through the profiler hooks.
  gpumem::torch::uninstall_cpu();
  REQUIRE_FALSE(gpumem::torch::cpu_installed());
  auto native_ledger = std::make_shared<Ledger>();
  std::vector<double> native_losses;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, native_ledger);
    native_losses = train(kSteps);
  }
  REQUIRE(native_ledger->allocs > 100);
  CHECK(native_ledger->current == 0);

  // gpumem, seen through the same hooks and through its own statistics.
  gpumem::torch::install_cpu();
  REQUIRE(gpumem::torch::cpu_installed());
  gpumem::torch::reset_cpu_peak_stats();
  const auto before = gpumem::torch::cpu_stats();
  auto ledger = std::make_shared<Ledger>();
  std::vector<double> losses;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, ledger);
    losses = train(kSteps);
  }
  const auto after = gpumem::torch::cpu_stats();

  // The same allocations, under either allocator.
  CHECK(ledger->allocs == native_ledger->allocs);
  CHECK(ledger->frees == native_ledger->frees);
  CHECK(ledger->total_allocated_bytes == native_ledger->total_allocated_bytes);
  CHECK(ledger->peak == native_ledger->peak);
  CHECK(ledger->current == 0);

  // gpumem's statistics say the same.
  CHECK(after.allocation[0].allocated - before.allocation[0].allocated == ledger->allocs);
  CHECK(after.allocation[0].freed - before.allocation[0].freed == ledger->frees);
  CHECK(after.requested_bytes[0].allocated - before.requested_bytes[0].allocated == ledger->total_allocated_bytes);
  CHECK(after.requested_bytes[0].peak - before.requested_bytes[0].current == ledger->peak);
  CHECK(after.allocation[0].current == before.allocation[0].current);
  CHECK(after.requested_bytes[0].current == before.requested_bytes[0].current);
  CHECK(after.reserved_bytes[0].peak >= after.allocated_bytes[0].peak);
  CHECK(after.allocated_bytes[0].peak >= after.requested_bytes[0].peak);

  // Same arithmetic: the losses agree (to float rounding: BLAS may block differently by alignment).
  REQUIRE(losses.size() == native_losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) CHECK(std::abs(losses[i] - native_losses[i]) <= 1e-4 * std::abs(native_losses[i]));
  CHECK(losses.back() < losses.front());
}

TEST_CASE("cpu 4: a snapshot taken mid-training agrees with the statistics") {
  ensure_installed();
  bool checked = false;
  train(4, [&](int step) {
    if (step != 2) return;
    const auto stats = gpumem::torch::cpu_stats();
    const auto snap = gpumem::torch::cpu_snapshot();
    REQUIRE_FALSE(snap.segments.empty());
    std::int64_t allocated_blocks = 0, allocated_bytes = 0, requested_bytes = 0;
    std::uintptr_t previous_end = 0;
    for (const auto& segment : snap.segments) {
      CHECK(segment.base >= previous_end);  // sorted, disjoint
      previous_end = segment.base + segment.size_bytes;
      std::uintptr_t next = segment.base;
      for (const auto& block : segment.blocks) {
        CHECK(block.addr == next);  // blocks tile the segment
        next += block.size_bytes;
        if (block.state == gpumem::alloc::BlockState::allocated) {
          ++allocated_blocks;
          allocated_bytes += static_cast<std::int64_t>(block.size_bytes);
          requested_bytes += static_cast<std::int64_t>(block.requested_bytes);
        }
      }
      CHECK(next == segment.base + segment.size_bytes);
    }
    CHECK(allocated_blocks == stats.allocation[0].current);
    CHECK(allocated_bytes == stats.allocated_bytes[0].current);
    CHECK(requested_bytes == stats.requested_bytes[0].current);
    CHECK(static_cast<std::int64_t>(snap.totals.reserved_bytes) == stats.reserved_bytes[0].current);
    checked = true;
  });
  CHECK(checked);
}

TEST_CASE("cpu 5: a forked child goes back to c10's allocator; the parent keeps gpumem") {
  ensure_installed();
  auto parent_tensor = torch::full({1000}, 3.0f);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    // The child: no Catch2 here, only an exit status.
    int code = 0;
    if (gpumem::torch::cpu_installed()) code |= 1;
    auto t = torch::ones({4096});
    if (gpumem::torch::engine(kCpu)->lookup(t.data_ptr()).has_value()) code |= 2;
    if (parent_tensor.sum().item<float>() != 3000.0f) code |= 4;
    parent_tensor.reset();  // frees into the child's copy of the engine
    _exit(code);
  }
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(gpumem::torch::cpu_installed());
  auto t = torch::ones({4096});
  CHECK(gpumem::torch::engine(kCpu)->lookup(t.data_ptr()).has_value());
  CHECK(parent_tensor.sum().item<float>() == 3000.0f);
}

TEST_CASE("cpu 9: everything is freed at the end, and empty_cache returns the memory") {
  ensure_installed();
  auto* engine = gpumem::torch::engine(kCpu);
  REQUIRE(engine != nullptr);
  engine->empty_cache();
  const auto stats = gpumem::torch::cpu_stats();
  const auto snap = gpumem::torch::cpu_snapshot();
  // Whatever is still allocated is a tensor libtorch itself keeps (none in this program).
  CHECK(stats.allocation[0].current == 0);
  CHECK(stats.allocated_bytes[0].current == 0);
  CHECK(stats.active_bytes[0].current == 0);
  CHECK(stats.requested_bytes[0].current == 0);
  CHECK(snap.totals.allocated_bytes == 0);
  CHECK(stats.reserved_bytes[0].current == static_cast<std::int64_t>(snap.totals.reserved_bytes));
  CHECK(snap.totals.reserved_bytes == 0);
  engine->check_invariants();
}
