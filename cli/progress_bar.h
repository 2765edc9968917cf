// ProgressBar: a one-line progress bar on stderr, drawn only when stderr is a terminal (so logs
// and pipes stay clean). It redraws at most ~10 times a second and erases itself when done.
//
// Thread-safety: one thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace gpumem::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::string label);
  ~ProgressBar();
  void update(std::size_t done, std::size_t total);
  void finish();
  static bool stderr_is_terminal() noexcept;

 private:
  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace gpumem::cli
