// The threaded c10d test double: its collectives compute what c10d specifies, and a failing,
// stalled or diverging rank makes every rank fail with a clear error instead of hanging.
#include "thread_group_backend.h"
#include "zero_test_helpers.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using gpumem::zero::testing::contains;
using gpumem::zero::testing::error_of;
using gpumem::zero::testing::run_ranks;
using gpumem::zero::testing::ThreadBackend;
using namespace std::chrono_literals;

namespace {

// Catch2's assertions are not thread-safe: rank threads check with expect(), which throws (and
// so fails that rank and aborts the group); the main thread asserts on the collected errors.
void expect(bool ok, const std::string& what) {
  if (!ok) throw std::runtime_error("expectation failed: " + what);
}

void require_all_ok(const std::vector<std::string>& errors) {
  for (std::size_t r = 0; r < errors.size(); ++r) {
    INFO("rank " << r << ": " << errors[r]);
    REQUIRE(errors[r].empty());
  }
}

}  // namespace

TEST_CASE("collectives compute what c10d specifies", "[zero][threads]") {
  at::set_num_threads(1);
  constexpr int kWorld = 4;
  std::atomic<int> checked{0};
  const auto errors = run_ranks(kWorld, [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
    expect(comm->getRank() == rank && comm->getSize() == kWorld, "rank and size");
    const double r = rank;

    // allreduce SUM and AVG (bf16 in, accumulated in double).
    std::vector<at::Tensor> t{at::full({5}, r + 1, at::kFloat)};
    c10d::AllreduceOptions sum;
    comm->allreduce(t, sum)->wait();
    expect(at::allclose(t[0], at::full({5}, 10.0)), "allreduce SUM");
    std::vector<at::Tensor> b{at::full({3}, 2 * r, at::kBFloat16)};
    c10d::AllreduceOptions avg;
    avg.reduceOp = c10d::ReduceOp::AVG;
    comm->allreduce(b, avg)->wait();
    expect(at::allclose(b[0].to(at::kFloat), at::full({3}, 3.0)), "allreduce AVG in bf16");

    // _reduce_scatter_base: rank r's input is [r, r, ..., r] + position; output is its slice.
    at::Tensor in = at::arange(kWorld * 2, at::kFloat) + r;
    at::Tensor out = at::empty({2}, at::kFloat);
    c10d::ReduceScatterOptions rs;
    rs.reduceOp = c10d::ReduceOp::AVG;
    comm->_reduce_scatter_base(out, in, rs)->wait();
    const at::Tensor expected = at::arange(kWorld * 2, at::kFloat).narrow(0, rank * 2, 2) + 1.5;
    expect(at::allclose(out, expected), "_reduce_scatter_base AVG");

    // _allgather_base in place: the input is this rank's slice of the output.
    at::Tensor full = at::full({kWorld * 3}, -1.0, at::kFloat);
    at::Tensor mine = full.narrow(0, rank * 3, 3);
    mine.fill_(r);
    comm->_allgather_base(full, mine)->wait();
    expect(at::equal(full, at::arange(kWorld, at::kFloat).repeat_interleave(3)),
           "in-place _allgather_base");

    // broadcast from rank 2.
    std::vector<at::Tensor> bc{at::full({4}, r, at::kFloat)};
    c10d::BroadcastOptions root;
    root.rootRank = 2;
    comm->broadcast(bc, root)->wait();
    expect(at::equal(bc[0], at::full({4}, 2.0)), "broadcast from rank 2");

    comm->barrier(c10d::BarrierOptions())->wait();
    auto* threads = dynamic_cast<ThreadBackend*>(comm.get());
    expect(threads != nullptr && threads->issued().at("allreduce") == 2, "issued() counts");
    ++checked;
  });
  require_all_ok(errors);
  CHECK(checked == kWorld);
}

TEST_CASE("collectives are asynchronous until wait", "[zero][threads]") {
  // Rank 0 issues two collectives before waiting on the first; rank 1 arrives late.
  const auto errors = run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
    std::vector<at::Tensor> a{at::ones({2})};
    std::vector<at::Tensor> b{at::ones({3})};
    if (rank == 1) std::this_thread::sleep_for(50ms);
    auto wa = comm->allreduce(a, c10d::AllreduceOptions());
    auto wb = comm->allreduce(b, c10d::AllreduceOptions());
    if (rank == 0) expect(!wa->isCompleted(), "incomplete before rank 1 arrives");
    wb->wait();
    wa->wait();
    expect(at::equal(a[0], at::full({2}, 2.0)) && at::equal(b[0], at::full({3}, 2.0)), "results");
  });
  require_all_ok(errors);
}

TEST_CASE("a rank that throws makes every rank fail quickly with its reason", "[zero][threads]") {
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(
      4,
      [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
        std::vector<at::Tensor> t{at::ones({8})};
        comm->allreduce(t, c10d::AllreduceOptions())->wait();
        if (rank == 3) throw std::runtime_error("injected failure on rank 3");
        comm->allreduce(t, c10d::AllreduceOptions())->wait();  // the others wait here
        throw std::logic_error("a collective completed without rank 3");
      },
      30s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CHECK(seconds < 5.0);  // aborted, not timed out
  CHECK(errors[3] == "injected failure on rank 3");
  for (int r = 0; r < 3; ++r) {
    INFO(errors[r]);
    CHECK(contains(errors[r], "rank 3 failed: injected failure on rank 3"));
    CHECK(contains(errors[r], "collective #1 allreduce(Float[8], SUM)"));
  }
}

TEST_CASE("a rank that never arrives times the others out, naming it", "[zero][threads]") {
  const auto errors = run_ranks(
      3,
      [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
        if (rank == 1) {
          std::this_thread::sleep_for(600ms);  // stalls past the 200 ms timeout
          comm->barrier(c10d::BarrierOptions())->wait();
          return;
        }
        comm->barrier(c10d::BarrierOptions())->wait();
      },
      200ms);
  for (int r = 0; r < 3; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(contains(errors[r],
                   "timed out after 200 ms in collective #0 barrier(): rank(s) 1 never arrived"));
  }
}

TEST_CASE("ranks calling different collectives fail with both named", "[zero][threads]") {
  const auto errors = run_ranks(2, [&](int rank, c10::intrusive_ptr<c10d::Backend> comm) {
    if (rank == 0) std::this_thread::sleep_for(20ms);  // rank 1 arrives first
    std::vector<at::Tensor> t{at::ones({rank == 0 ? 4 : 5})};
    comm->allreduce(t, c10d::AllreduceOptions())->wait();
  });
  for (const std::string& e : errors) {
    INFO(e);
    CHECK(contains(e, "collective #0 mismatch: rank "));  // whichever arrived first is named first
    CHECK(contains(e, "called allreduce(Float[5], SUM)"));
    CHECK(contains(e, "called allreduce(Float[4], SUM)"));
  }
}

TEST_CASE("unsupported requests are refused clearly", "[zero][threads]") {
  std::string max_error, size_error;
  const auto errors = run_ranks(1, [&](int, c10::intrusive_ptr<c10d::Backend> comm) {
    std::vector<at::Tensor> t{at::ones({2})};
    c10d::AllreduceOptions max;
    max.reduceOp = c10d::ReduceOp::MAX;
    max_error = error_of([&] { comm->allreduce(t, max); });
    at::Tensor out = at::empty({3});
    at::Tensor in = at::empty({2});
    size_error = error_of([&] { comm->_allgather_base(out, in, c10d::AllgatherOptions()); });
  });
  require_all_ok(errors);
  CHECK(contains(max_error, "implements SUM and AVG"));
  CHECK(contains(size_error, "must be world size (1) times input"));
}
