#include "gpumem/ckpt/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace gpumem::ckpt {
namespace {

// Resolves last = 0 to n and checks the range; `who` names the factory in errors.
std::size_t checked_range(const char* who, std::size_t n, std::size_t first, std::size_t last) {
  if (last == 0) last = n;
  if (first > last || last > n) {
    throw std::invalid_argument(fmt::format(
        "Plan::{}: range [{}, {}) is not inside the chain of {} modules; pass 0 <= first <= "
        "last <= {}",
        who, first, last, n, n));
  }
  return last;
}

}  // namespace

Plan::Plan(std::size_t n_modules, std::vector<Segment> checkpointed)
    : n_modules_(n_modules), segments_(std::move(checkpointed)) {
  std::size_t prev_end = 0;
  for (std::size_t k = 0; k < segments_.size(); ++k) {
    const Segment& s = segments_[k];
    if (s.begin >= s.end) {
      throw std::invalid_argument(fmt::format(
          "Plan: segment {} is [{}, {}), which is empty; a segment needs begin < end", k,
          s.begin, s.end));
    }
    if (s.end > n_modules) {
      throw std::invalid_argument(fmt::format(
          "Plan: segment [{}, {}) ends past the chain of {} modules; keep end <= {}", s.begin,
          s.end, n_modules, n_modules));
    }
    if (k > 0 && s.begin < prev_end) {
      throw std::invalid_argument(fmt::format(
          "Plan: segment [{}, {}) overlaps or precedes the one before it (ending at {}); list "
          "segments sorted and disjoint",
          s.begin, s.end, prev_end));
    }
    prev_end = s.end;
  }
}

Plan Plan::none(std::size_t n_modules) { return Plan(n_modules, {}); }

Plan Plan::every(std::size_t n_modules, std::size_t first, std::size_t last) {
  return grouped(n_modules, 1, first, last);
}

Plan Plan::grouped(std::size_t n_modules, std::size_t group, std::size_t first,
                   std::size_t last) {
  last = checked_range("grouped", n_modules, first, last);
  if (group == 0) {
    throw std::invalid_argument("Plan::grouped: group is 0; pass the number of modules per segment (>= 1)");
  }
  std::vector<Segment> segments;
  for (std::size_t b = first; b < last; b += group) {
    segments.push_back({b, std::min(b + group, last)});
  }
  return Plan(n_modules, std::move(segments));
}

Plan Plan::sqrt_n(std::size_t n_modules, std::size_t first, std::size_t last) {
  last = checked_range("sqrt_n", n_modules, first, last);
  const std::size_t m = last - first;
  if (m == 0) return none(n_modules);
  auto k = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(m))));
  k = std::min(k, m);
  // k segments whose lengths differ by at most one: the first m % k get one more module.
  std::vector<Segment> segments;
  std::size_t b = first;
  for (std::size_t s = 0; s < k; ++s) {
    std::size_t len = m / k + (s < m % k ? 1 : 0);
    segments.push_back({b, b + len});
    b += len;
  }
  return Plan(n_modules, std::move(segments));
}

std::size_t Plan::checkpointed_modules() const noexcept {
  std::size_t total = 0;
  for (const Segment& s : segments_) total += s.size();
  return total;
}

const Segment* Plan::segment_of(std::size_t module) const noexcept {
  auto it = std::upper_bound(segments_.begin(), segments_.end(), module,
                             [](std::size_t m, const Segment& s) { return m < s.begin; });
  if (it == segments_.begin()) return nullptr;
  --it;
  return module < it->end ? &*it : nullptr;
}

std::string Plan::to_string() const {
  if (segments_.empty()) return "none";
  std::string out;
  for (const Segment& s : segments_) {
    if (!out.empty()) out += ' ';
    out += fmt::format("ckpt[{},{})", s.begin, s.end);
  }
  return out;
}

Plan Plan::parse(std::size_t n_modules, const std::string& text) {
  auto fail = [&](const std::string& why) -> Plan {
    throw std::invalid_argument(fmt::format(
        "plan '{}': {}; write \"none\" or segments like \"ckpt[1,3) ckpt[5,6)\" (half-open "
        "module ranges, sorted)",
        text, why));
  };
  std::string t;
  for (char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  }
  if (t == "none" || t.empty()) return none(n_modules);
  std::vector<Segment> segments;
  std::size_t pos = 0;
  while (pos < t.size()) {
    if (t.compare(pos, 5, "ckpt[") != 0) return fail("expected 'ckpt[' at offset " + std::to_string(pos));
    pos += 5;
    auto number = [&](std::size_t& value) {
      const char* first = t.data() + pos;
      const auto [end, ec] = std::from_chars(first, t.data() + t.size(), value);
      if (ec != std::errc() || end == first) {
        fail("expected a module index at offset " + std::to_string(pos));
      }
      pos += static_cast<std::size_t>(end - first);
    };
    std::size_t b = 0, e = 0;
    number(b);
    if (pos >= t.size() || t[pos] != ',') return fail("expected ',' after the segment's begin");
    ++pos;
    number(e);
    if (pos >= t.size() || t[pos] != ')') return fail("expected ')' after the segment's end");
    ++pos;
    segments.push_back({b, e});
  }
  return Plan(n_modules, std::move(segments));
}

}  // namespace gpumem::ckpt
