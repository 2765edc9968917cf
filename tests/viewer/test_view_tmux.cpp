// End to end: `gpumem view` in a real terminal (tmux, fixed size) on a shared trace; keys are sent
// with send-keys and the screen is read back with capture-pane. Every wait polls for the expected
// text with a timeout, so a slow machine makes the test slower, not flaky.
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <fmt/format.h>

#include "catch.h"
#include "gpumem/view/view_state.h"
#include "gpumem/view/viewer_model.h"
#include "viewer_test_support.h"

using namespace gpumem::view;
using namespace gpumem::view::testing;

namespace {

std::string run(const std::string& cmd, int* status = nullptr) {
  std::string out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return out;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = pclose(p);
  if (status) *status = rc;
  return out;
}

class Tmux {
 public:
  Tmux() : socket_(fmt::format("gpumem-view-test-{}", getpid())) {}
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
  CHECK(out.find("FRAGMENTATION: 692.0 MiB reserved but unallocated") != std::string::npos);
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
