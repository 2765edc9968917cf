// Running a program from a test: run_command(shell command) gives its exit status and its
// stdout and stderr together; run_cli(args) runs the gpumem tool (tests whose target defines
// GPUMEM_CLI_PATH, the tool's path).
//
// Thread-safety: like popen (call from the test's thread).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace gpumem::testing {

struct CommandRun {
  int status = -1;  // the exit status; -1 when the program did not exit (a signal)
  std::string out;  // stdout and stderr together
};

// Runs `command` through /bin/sh with stderr sent to stdout. Throws std::runtime_error when no
// shell can be started.
inline CommandRun run_command(const std::string& command) {
  CommandRun r;
  FILE* p = popen((command + " 2>&1").c_str(), "r");
  if (!p) throw std::runtime_error("cannot start a shell for: " + command);
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

#ifdef GPUMEM_CLI_PATH
// `gpumem ARGS` (ARGS are shell words).
inline CommandRun run_cli(const std::string& args) {
  return run_command(std::string("'") + GPUMEM_CLI_PATH + "' " + args);
}
#endif

}  // namespace gpumem::testing
