// gpumem: the command-line front end of gpumem's forensics. `gpumem COMMAND ...`; see --help.
#include <cstdio>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "commands.h"

namespace {

std::vector<gpumem::cli::Command> all_commands() {
  return {gpumem::cli::replay_command(), gpumem::cli::report_command(), gpumem::cli::diff_command(),
          gpumem::cli::view_command()};
}

void print_help(const std::vector<gpumem::cli::Command>& commands) {
  std::string text =
      "usage: gpumem COMMAND [ARGS...]\n"
      "\n"
      "GPU memory forensics for PyTorch programs.\n"
      "\n"
      "commands:\n";
  for (const auto& c : commands) text += fmt::format("  {:<10} {}\n", c.name, c.summary);
  text +=
      "\n"
      "options:\n"
      "  -h, --help     show this help; `gpumem COMMAND --help` explains a command's options\n"
      "  --version      print gpumem's version\n";
  std::fputs(text.c_str(), stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const auto commands = all_commands();
  if (argc < 2) {
    print_help(commands);
    return 2;
  }
  const std::string_view first = argv[1];
  if (first == "-h" || first == "--help" || first == "help") {
    print_help(commands);
    return 0;
  }
  if (first == "--version") {
    std::puts("gpumem 0.1.0");
    return 0;
  }
  for (const auto& c : commands) {
    if (c.name == first) {
      std::vector<std::string_view> args(argv + 2, argv + argc);
      return c.run(args);
    }
  }
  std::string names;
  for (const auto& c : commands) names += fmt::format("{}{}", names.empty() ? "" : ", ", c.name);
  std::fputs(fmt::format("gpumem: unknown command '{}' (the commands are: {}); see 'gpumem --help'\n", first, names)
                 .c_str(),
             stderr);
  return 2;
}
