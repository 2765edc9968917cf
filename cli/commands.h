// The subcommands of the `gpumem` tool. A subcommand is a name, a one-line summary, and a run
// function that gets the arguments after its name. To add one: write NAME_command.cpp defining
// `Command NAME_command()`, declare it here, and add it to all_commands() in main.cpp.
//
// Thread-safety: run functions are called once, from main.
#pragma once

#include <string_view>
#include <vector>

namespace gpumem::cli {

struct Command {
  std::string_view name;
  std::string_view summary;
  int (*run)(const std::vector<std::string_view>& args);  // returns the exit status
};

Command replay_command();
Command report_command();
Command diff_command();
Command view_command();

}  // namespace gpumem::cli
