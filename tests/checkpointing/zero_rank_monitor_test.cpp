// RankMonitor's failure reports through a store: ordered, naming the silent ranks, once per
// rank. (The watchdog ends a process, so zero_process_test checks it with real processes.)
#include "zero_test_helpers.h"

#include <gpumem/zero/error_message.h>
#include <gpumem/zero/rank_monitor.h>

#include <thread>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

// catch.h comes after the torch headers: c10's logging defines a CHECK macro of its own.
#include "catch.h"

using namespace gpumem::zero;
using namespace gpumem::zero::testing;
using namespace std::chrono_literals;

namespace {

RankMonitorOptions quiet() {
  RankMonitorOptions o;
  o.watchdog = false;
  o.report_wait = 100ms;
  return o;
}

}  // namespace

TEST_CASE("failure reports are ordered and name the ranks that said nothing", "[zero][monitor]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RankMonitor r0(store, 0, 3, quiet());
  RankMonitor r1(store, 1, 3, quiet());
  RankMonitor r2(store, 2, 3, quiet());
  CHECK(r0.failures().empty());

  const std::string first = r2.report_failure("out of memory in forward");
  CHECK(contains(first, "rank 2 of 3 failed: out of memory in forward"));
  CHECK(contains(first, "ranks that reported no failure: 0, 1"));

  const std::string second = r0.report_failure("Connection closed by peer");
  INFO(second);
  CHECK(contains(second, "rank 0 of 3 failed: Connection closed by peer"));
  CHECK(contains(second, "1. rank 2: out of memory in forward"));
  CHECK(contains(second, "2. rank 0 (this rank): Connection closed by peer"));
  CHECK(contains(second, "ranks that reported no failure: 1 "));

  const std::vector<RankFailure> all = r1.failures();
  REQUIRE(all.size() == 2);
  CHECK(all[0].rank == 2);
  CHECK(all[0].order == 1);
  CHECK(all[1].rank == 0);
  CHECK(all[1].reason == "Connection closed by peer");

  // A rank reports once; a second failure is returned as it is.
  CHECK(r2.report_failure("again") == "again");
  CHECK(r1.failures().size() == 2);
}

TEST_CASE("a watchdog that sees no failure leaves the process alone", "[zero][monitor]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  RankMonitorOptions o;
  o.poll_interval = 10ms;
  o.grace = 0ms;
  RankMonitor r0(store, 0, 2, o);
  std::this_thread::sleep_for(100ms);  // polls several times: nothing reported
  r0.finish();
  r0.finish();  // idempotent
  SUCCEED("the watchdog ran and stopped");
}

TEST_CASE("bad monitor arguments are refused", "[zero][monitor]") {
  auto store = c10::make_intrusive<c10d::HashStore>();
  CHECK(contains(error_of([&] { RankMonitor m(store, 3, 3, quiet()); }),
                 "rank 3 is outside a world of 3"));
  RankMonitorOptions o = quiet();
  o.poll_interval = 0ms;
  CHECK(contains(error_of([&] { RankMonitor m(store, 0, 2, o); }), "poll_interval must be > 0"));
  CHECK(contains(error_of([&] { RankMonitor m(nullptr, 0, 2, quiet()); }), "store is null"));
}

TEST_CASE("error messages leave libtorch's backtrace out", "[zero][monitor]") {
  try {
    TORCH_CHECK(false, "wait timeout after 3000ms");
  } catch (const c10::Error& e) {
    CHECK(std::string(e.what()).find("Exception raised from") != std::string::npos);
    CHECK(error_message(e) == "wait timeout after 3000ms");
  }
  CHECK(error_message(std::runtime_error("plain")) == "plain");
}
