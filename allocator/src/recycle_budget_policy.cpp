#include "recycle_budget_policy.h"

#include <algorithm>
#include <cmath>

namespace gpumem::alloc::policy {

bool within_slack(std::size_t bought_bytes, std::size_t adding_bytes, std::size_t reserved_bytes,
                  double slack) noexcept {
  const std::size_t bought = std::min(bought_bytes, reserved_bytes);  // a release may have given some back
  const double rest = static_cast<double>(reserved_bytes - bought);
  return static_cast<double>(bought) + static_cast<double>(adding_bytes) <= slack * rest;
}

std::size_t bought_estimate(std::size_t counted_bytes, std::size_t reserved_bytes,
                            std::size_t in_use_high_bytes) noexcept {
  const std::size_t beyond_in_use = reserved_bytes - std::min(reserved_bytes, in_use_high_bytes);
  return std::min(counted_bytes, beyond_in_use);
}

bool within_guard(std::size_t bought_bytes, std::size_t adding_bytes, std::size_t created_bytes,
                  std::size_t reserved_bytes, std::size_t in_use_high_bytes, const RecycleBudgetRules& rules) noexcept {
  if (!within_slack(bought_bytes, adding_bytes, reserved_bytes, rules.slack)) return false;
  if (!(rules.ceiling > 0.0)) return true;
  return static_cast<double>(reserved_bytes) + static_cast<double>(created_bytes) <=
         (1.0 + rules.ceiling) * static_cast<double>(in_use_high_bytes);
}

bool within_headroom(std::size_t reserved_bytes, std::size_t adding_bytes, std::size_t in_use_high_bytes,
                     double headroom) noexcept {
  if (!(headroom > 0.0)) return false;
  return static_cast<double>(reserved_bytes) + static_cast<double>(adding_bytes) <=
         (1.0 + headroom) * static_cast<double>(in_use_high_bytes);
}

bool fence_may_create(std::size_t reserved_bytes, std::size_t adding_bytes, std::size_t in_use_high_bytes) noexcept {
  return adding_bytes == 0 || reserved_bytes + adding_bytes <= in_use_high_bytes;
}

RecycleBudget::RecycleBudget(const RecycleBudgetRules& rules) noexcept
    : rules_(rules), tokens_ns_(static_cast<double>(std::max<std::int64_t>(rules.burst_ns, 0))) {}

bool RecycleBudget::allows(std::int64_t now_ns) noexcept {
  if (rules_.unlimited()) return true;
  if (rules_.none()) {
    ++denials_;
    return false;
  }
  if (!started_) {
    started_ = true;
    last_ns_ = now_ns;
  } else if (now_ns > last_ns_) {
    const double cap = static_cast<double>(std::max<std::int64_t>(rules_.burst_ns, 0));
    tokens_ns_ = std::min(cap, tokens_ns_ + rules_.fraction * static_cast<double>(now_ns - last_ns_));
    last_ns_ = now_ns;
  }
  if (tokens_ns_ > 0) return true;
  ++denials_;
  return false;
}

void RecycleBudget::charge(std::int64_t spent_ns) noexcept {
  if (rules_.unlimited() || spent_ns <= 0) return;
  spent_ns_ += spent_ns;
  tokens_ns_ -= static_cast<double>(spent_ns);
}

void ChurnMeter::note_recycling(std::int64_t now_ns, std::int64_t spent_ns) noexcept {
  level_ns_ = share(now_ns) * static_cast<double>(kWindowNs) + static_cast<double>(std::max<std::int64_t>(spent_ns, 0));
  last_ns_ = std::max(last_ns_, now_ns);
}

double ChurnMeter::share(std::int64_t now_ns) const noexcept {
  const double dt = static_cast<double>(std::max<std::int64_t>(now_ns - last_ns_, 0));
  return level_ns_ * std::exp(-dt / static_cast<double>(kWindowNs)) / static_cast<double>(kWindowNs);
}

bool ChurnMeter::open(std::int64_t now_ns, const RecycleBudgetRules& rules) noexcept {
  if (!(rules.churn > 0.0) || !(rules.churn_allowance > 0.0)) return open_ = false;
  const double s = share(now_ns);
  if (open_) {
    open_ = s >= rules.churn / 4;
  } else if (s >= rules.churn) {
    open_ = true;
    ++openings_;
  }
  return open_;
}

RecycleBudgetRules ChurnMeter::allowed_rules(const RecycleBudgetRules& rules) noexcept {
  RecycleBudgetRules r = rules;
  r.slack = std::min(1.0, r.slack + rules.churn_allowance);
  if (r.ceiling > 0.0) r.ceiling += rules.churn_allowance;
  return r;
}

}  // namespace gpumem::alloc::policy
