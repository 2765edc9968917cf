// End to end: `gpumem view` in a real terminal (tmux, fixed size) on a shared trace; keys are sent
// with send-keys and the screen is read back with capture-pane. Every wait polls for the expected
// text with a timeout, so a slow machine makes the test slower, not flaky.
#include <unistd.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <vector>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "catch.h"
#include "gpumem/view/cell_grid.h"
#include "gpumem/view/view_state.h"
#include "gpumem/view/viewer_model.h"
#include "run_command.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

namespace {

// Runs a shell command; returns its output (stdout and stderr), and its exit status in *status.
std::string run(const std::string& cmd, int* status = nullptr) {
  gpumem::testing::CommandRun r = gpumem::testing::run_command(cmd);
  if (status) *status = r.status;
  return std::move(r.out);
}

class Tmux {
 public:
  Tmux() : socket_(fmt::format("gpumem-view-test-{}-{}", getpid(), next_id_++)) {}
  ~Tmux() { run(tmux("kill-server")); }
  std::string tmux(const std::string& args) const { return fmt::format("LANG=C.UTF-8 tmux -u -L {} -f /dev/null {}", socket_, args); }
  std::string screen() const { return run(tmux("capture-pane -p -t v")); }
  void keys(const std::string& keys) const { run(tmux("send-keys -t v " + keys)); }
  // Polls the screen until it contains `text` (or the timeout passes); returns the last screen.
  std::string wait_for(const std::string& text, double timeout_s = 30.0) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    std::string s;
    while (std::chrono::steady_clock::now() < deadline) {
      s = screen();
      if (s.find(text) != std::string::npos) return s;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return s;
  }
  bool alive() const {
    int status = 0;
    run(tmux("has-session -t v"), &status);
    return status == 0;
  }

 private:
  static inline int next_id_ = 0;  // one tmux server per session: a quitting one never takes a new one down
  std::string socket_;
};

#define REQUIRE_SCREEN(tm, text)                     \
  do {                                               \
    const std::string screen_ = (tm).wait_for(text); \
    INFO("screen:\n" << screen_);                    \
    REQUIRE(screen_.find(text) != std::string::npos); \
  } while (false)

}  // namespace

TEST_CASE("gpumem view under tmux: keys, views, resize, quit", "[viewer][e2e]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  int status = 0;
  run("tmux -V", &status);
  if (status != 0) GPUMEM_SKIP("tmux is not installed (scripts/setup.sh installs it)");
  const std::string file = *dir + "/traces/native/oom.snapshot.pickle";
  const auto model = ViewerModel::open(file);

  Tmux tm;
  run(tm.tmux(fmt::format("new-session -d -s v -x 100 -y 30 \"env LANG=C.UTF-8 {} view {}\"",
                          GPUMEM_CLI_PATH, file)));
  // An OOM snapshot opens on its verdict.
  REQUIRE_SCREEN(tm, "OOM verdict");
  REQUIRE_SCREEN(tm, "FRAGMENTATION");
  REQUIRE_SCREEN(tm, "? help  q quit");

  tm.keys("3");
  REQUIRE_SCREEN(tm, "allocated (peak");
  tm.keys("p");
  REQUIRE_SCREEN(tm, fmt::format("entry {}/{}", model.peak_reserved_cursor(), model.entry_count()));
  tm.keys("Home");
  REQUIRE_SCREEN(tm, fmt::format("entry 0/{}", model.entry_count()));
  tm.keys("Right");
  REQUIRE_SCREEN(tm, fmt::format("entry {}/{}", timeline_step(model, Size{100, 30}), model.entry_count()));
  tm.keys("o");
  REQUIRE_SCREEN(tm, fmt::format("entry {}/{}", *model.oom_cursor(), model.entry_count()));

  tm.keys("4");
  REQUIRE_SCREEN(tm, "live blocks");
  tm.keys("/ o o m Enter");
  REQUIRE_SCREEN(tm, "/oom");
  REQUIRE_SCREEN(tm, "oom_repro.py");

  // The Active view: the same cursor, zoomed about it, regrouped, then one column back; the
  // screen shows what reduce() computes for the same keys.
  tm.keys("7");
  REQUIRE_SCREEN(tm, "live by call site │");
  REQUIRE_SCREEN(tm, fmt::format("at the cursor (entry {}/{}", *model.oom_cursor(), model.entry_count()));
  tm.keys("+ g Left");
  REQUIRE_SCREEN(tm, "zoom 2x");
  REQUIRE_SCREEN(tm, "live by function │");
  {
    ViewState expected = initial_state(model, Size{100, 30});
    expected.cursor = *model.oom_cursor();
    for (const Key& k : {Key::chr(U'7'), Key::chr(U'+'), Key::chr(U'g'), Key::of(KeyCode::left)}) expected = reduce(expected, k, model);
    REQUIRE(expected.cursor != *model.oom_cursor());
    REQUIRE_SCREEN(tm, fmt::format("at the cursor (entry {}/{}", expected.cursor, model.entry_count()));
  }
  tm.keys("o");
  REQUIRE_SCREEN(tm, fmt::format("at the cursor (entry {}/{}", *model.oom_cursor(), model.entry_count()));

  tm.keys("2");
  REQUIRE_SCREEN(tm, "1 cell =");
  tm.keys("5");
  REQUIRE_SCREEN(tm, "What pins");
  tm.keys("?");
  REQUIRE_SCREEN(tm, "Trace cursor");
  tm.keys("Escape");
  REQUIRE_SCREEN(tm, "What pins");

  run(tm.tmux("resize-window -t v -x 60 -y 20"));
  REQUIRE_SCREEN(tm, "↑↓ segment");
  const std::string small = tm.screen();
  std::size_t lines = 0;
  for (char c : small) lines += c == '\n';
  CHECK(lines <= 20);

  tm.keys("q");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (tm.alive() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(tm.alive());
}

TEST_CASE("gpumem view --report prints every view without a terminal", "[viewer][e2e]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  int status = 0;
  const std::string out = run(fmt::format("{} view --report {}/traces/native/oom.snapshot.pickle --width 100 < /dev/null",
                                          GPUMEM_CLI_PATH, *dir), &status);
  CHECK(status == 0);
  CHECK(out.find("FRAGMENTATION: 200.00 MiB request, largest usable free extent 196.00 MiB") != std::string::npos);
  CHECK(out.find("reserved-unallocated      692.00 MiB") != std::string::npos);
  CHECK(out.find("Advice (forensics OOM report)") != std::string::npos);
  CHECK(out.find("allocated (peak") != std::string::npos);
  CHECK(out.find("What pins") != std::string::npos);
  CHECK(out.find("1 cell =") != std::string::npos);
  const std::string bad = run(fmt::format("{} view /nonexistent.pickle", GPUMEM_CLI_PATH), &status);
  CHECK(status != 0);
  CHECK(bad.find("cannot open the file") != std::string::npos);
  const std::string no_tty = run(fmt::format("{} view {}/traces/native/oom.snapshot.pickle < /dev/null", GPUMEM_CLI_PATH, *dir), &status);
  CHECK(status != 0);
  CHECK(no_tty.find("--report") != std::string::npos);
}

TEST_CASE("gpumem view degrades from 256 colors to 8 and to monochrome", "[viewer][e2e]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  int status = 0;
  run("tmux -V", &status);
  if (status != 0) GPUMEM_SKIP("tmux is not installed (scripts/setup.sh installs it)");
  const std::string file = *dir + "/traces/native/oom.snapshot.pickle";
  struct Case {
    const char* term;
    const char* colors;
    bool expect_256, expect_color;
  };
  // xterm-256color (in ncurses-base everywhere) offers 256 colors; --colors forces fewer.
  for (const Case c : {Case{"xterm-256color", "auto", true, true}, Case{"xterm-256color", "8", false, true},
                       Case{"xterm-256color", "none", false, false},
                       // and it follows the terminal by itself: xterm has 8 colors, vt100 none.
                       Case{"xterm", "auto", false, true}, Case{"vt100", "auto", false, false}}) {
    INFO("TERM=" << c.term << " --colors " << c.colors);
    Tmux tm;
    run(tm.tmux(fmt::format("-2 new-session -d -s v -x 100 -y 30 \"env LANG=C.UTF-8 TERM={} {} view {} --colors {}\"", c.term,
                            GPUMEM_CLI_PATH, file, c.colors)));
    REQUIRE_SCREEN(tm, "OOM verdict");
    const std::string styled = run(tm.tmux("capture-pane -e -p -t v"));
    INFO(styled);
    // SGR parameters: 38;5;N / 48;5;N for 256 colors, 30-37 / 40-47 for the 8 colors (39 / 49 reset).
    bool has_256 = false, has_color = false;
    const std::regex sgr("\x1b\\[([0-9;]*)m");
    for (auto it = std::sregex_iterator(styled.begin(), styled.end(), sgr); it != std::sregex_iterator(); ++it) {
      std::vector<int> params;
      std::stringstream ps((*it)[1].str());
      for (std::string p; std::getline(ps, p, ';');) params.push_back(p.empty() ? 0 : std::stoi(p));
      for (std::size_t i = 0; i < params.size(); ++i) {
        const int v = params[i];
        if ((v == 38 || v == 48) && i + 1 < params.size() && params[i + 1] == 5) {
          has_256 = has_color = true;
          i += 2;
        } else if ((v >= 30 && v <= 37) || (v >= 40 && v <= 47)) {
          has_color = true;
        }
      }
    }
    CHECK(has_256 == c.expect_256);
    CHECK(has_color == c.expect_color);
    if (!c.expect_color) CHECK(styled.find("\x1b[7m") != std::string::npos);  // mono: the title bar in reverse video
    tm.keys("q");
  }
}

TEST_CASE("gpumem view --report --diff compares two files", "[viewer][e2e]") {
  const auto dir = shared_dir();
  if (!dir) GPUMEM_SKIP("GPUMEM_SHARED_DIR has no traces/");
  int status = 0;
  const std::string out = run(fmt::format("{0} view --report {1}/traces/native/oom.snapshot.pickle --diff {1}/traces/native/oom.trace.csv.gz",
                                          GPUMEM_CLI_PATH, *dir), &status);
  CHECK(status == 0);
  CHECK(out.find("B = ") != std::string::npos);
  CHECK(out.find("count A→B") != std::string::npos);
}

TEST_CASE("gpumem view --report --at: the Active view at 80 columns on the repository's ResNet-50 trace", "[viewer][e2e]") {
  const char* src = std::getenv("GPUMEM_SOURCE_DIR");
  REQUIRE(src != nullptr);
  const std::string file = std::string(src) + "/traces/resnet50.native.trace.csv.gz";
  const auto model = ViewerModel::open(file);
  int status = 0;
  const std::string out = run(fmt::format("{} view --report {} --width 80 --at alloc-peak < /dev/null", GPUMEM_CLI_PATH, file), &status);
  CHECK(status == 0);
  CHECK(out.find(" live by call site │ top 6 of 17 groups + other │ whole trace\n") != std::string::npos);
  CHECK(out.find(fmt::format("at the cursor (entry {}/{}", model.peak_allocated_cursor(), model.entry_count())) != std::string::npos);
  CHECK(out.find("resnet.py:154:forward") != std::string::npos);
  CHECK(out.find("other (11 groups)") != std::string::npos);
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    INFO(line);
    CHECK(decode_utf8(line).size() <= 80);
  }
  // README.md shows this screen (the code block after the command line): it must be what the
  // command prints today.
  std::ifstream readme(std::string(src) + "/README.md");
  REQUIRE(readme.good());
  std::string excerpt, line;
  bool after_command = false, in_block = false;
  while (std::getline(readme, line)) {
    if (line.find("--width 80 --at alloc-peak") != std::string::npos) after_command = true;
    if (!after_command) continue;
    if (line.find("```") != std::string::npos) {
      if (in_block) break;
      in_block = true;
      continue;
    }
    if (in_block) excerpt += (line.size() >= 4 ? line.substr(4) : std::string()) + "\n";
  }
  INFO("README excerpt:\n" << excerpt);
  REQUIRE_FALSE(excerpt.empty());
  CHECK(out.find(excerpt) != std::string::npos);
  // A moment the trace does not have is one clear error; a malformed one is a usage error.
  const std::string no_oom = run(fmt::format("{} view --report {} --at oom", GPUMEM_CLI_PATH, file), &status);
  CHECK(status == 1);
  CHECK(no_oom.find("records no OOM") != std::string::npos);
  const std::string past = run(fmt::format("{} view --report {} --at entry:99999999", GPUMEM_CLI_PATH, file), &status);
  CHECK(status == 1);
  CHECK(past.find("past the trace's end") != std::string::npos);
  run(fmt::format("{} view --report {} --at soon", GPUMEM_CLI_PATH, file), &status);
  CHECK(status == 2);
}
