#include "progress_bar.h"

#include <unistd.h>

#include <cstdio>

#include <fmt/format.h>

namespace gpumem::cli {

bool ProgressBar::stderr_is_terminal() noexcept { return isatty(STDERR_FILENO) == 1; }

ProgressBar::ProgressBar(std::string label) : label_(std::move(label)), enabled_(stderr_is_terminal()) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::update(std::size_t done, std::size_t total) {
  if (!enabled_ || total == 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
  last_ = now;
  constexpr int kWidth = 30;
  const double frac = static_cast<double>(done) / static_cast<double>(total);
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::fputs(fmt::format("\r{} [{}] {:3.0f}%", label_, bar, frac * 100).c_str(), stderr);
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::finish() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace gpumem::cli
