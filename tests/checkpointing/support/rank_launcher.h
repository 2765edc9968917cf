// RankLauncher: starts N processes of a program the way torchrun starts a job's workers, waits
// for them with a hard deadline, and reports how each ended. A test double of torchrun for CI.
//
// Every process gets RANK, WORLD_SIZE, LOCAL_RANK (= RANK: one node), MASTER_ADDR=127.0.0.1,
// MASTER_PORT and OMP_NUM_THREADS=1 on top of this process's environment. The store:
//
//   * agent_store (torchrun's default): the launcher itself serves a TCPStore on a port the
//     kernel picks (no collisions between tests running at once) and sets
//     TORCHELASTIC_USE_AGENT_STORE=True, so every rank connects as a client;
//   * otherwise rank 0 serves the store, on a port found free just before the launch.
//
// The processes share one process group; at the deadline the launcher kills the whole group
// (SIGKILL) and reaps it, so a hung rank never outlives the test. Each rank's stdout and stderr
// go to files in a fresh temporary directory, which the result names (and the caller removes).
//
// Thread-safety: launch() may run from any one thread; the child side between fork and exec
// uses only async-signal-safe calls.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace gpumem::zero::testing {

struct RankExit {
  int exit_code = -1;    // when the process exited
  int signal = 0;        // when a signal ended it (SIGKILL when the launcher killed it)
  bool killed_at_deadline = false;
  double seconds = 0;    // from the launch to its end
  std::string out;       // its stdout
  std::string err;       // its stderr
};

struct LaunchResult {
  std::vector<RankExit> ranks;
  bool deadline_hit = false;
  double seconds = 0;  // until the last rank ended (or the deadline)
  std::string dir;     // the run's directory (rank logs; passed to the program as it likes)
  std::string describe() const;  // one paragraph per rank: how it ended and its stderr's tail
};

struct LaunchSpec {
  std::string program;
  std::vector<std::string> args;  // "{dir}" in an argument is replaced by the run's directory
  int world_size = 2;
  bool agent_store = true;
  std::chrono::milliseconds deadline{std::chrono::seconds(120)};
};

// Throws std::runtime_error when the processes cannot be started at all.
LaunchResult launch(const LaunchSpec& spec);

// Removes a launch directory and its files.
void remove_launch_dir(const std::string& dir);

}  // namespace gpumem::zero::testing
