// LaunchEnv: where this process sits in a distributed job, read the way torchrun passes it.
//
// torchrun (and torch.distributed.launch, SLURM wrappers, our scripts) hand every process
// RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. parse_launch_env() reads them once
// and validates them; nothing else in gpumem::zero reads the environment.
//
// Invariants of a LaunchEnv: 0 <= rank < world_size; local_rank >= 0; 1 <= master_port <= 65535;
// master_addr is not empty. When none of the five variables is set the process is a world of
// one (rank 0, local rank 0, from_environment = false) and needs no rendezvous; when some but not
// all are set, that is an error naming the missing ones.
//
// Who serves the rendezvous store. torchrun's agent already listens on MASTER_PORT and tells its
// workers so with TORCHELASTIC_USE_AGENT_STORE=True: then every rank, rank 0 included, is a
// client of that store. Without it (a launcher that only sets the five variables) rank 0 serves
// the store and the other ranks connect, as torch.distributed's env:// rendezvous does.
//
// Thread-safety: plain value; parse_launch_env() is reentrant (it only calls the lookup given).
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>

namespace gpumem::zero {

struct LaunchEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  std::uint16_t master_port = 29500;
  bool from_environment = false;  // false: no launcher variables at all, a world of one
  // TORCHELASTIC_USE_AGENT_STORE=True: the launcher's agent serves the store at
  // MASTER_ADDR:MASTER_PORT and rank 0 connects to it like every other rank.
  bool agent_store = false;
};

// A bad or missing launcher variable. what() names the variable, the value and the fix.
class LaunchEnvError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// `lookup(name)` returns the variable's value or nullptr when unset (std::getenv by default).
using EnvLookup = std::function<const char*(const char*)>;

// Throws LaunchEnvError on a malformed, out-of-range or partially given set of variables.
LaunchEnv parse_launch_env(const EnvLookup& lookup);
LaunchEnv launch_env_from_environment();

std::string describe(const LaunchEnv& env);

}  // namespace gpumem::zero
