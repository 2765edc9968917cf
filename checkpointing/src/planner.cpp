// Note [Checkpoint cost model]
//
// The profile is one step measured without checkpointing (chain_profile.h has the names: A[i]
// allocated before module i, kept_i = A[i+1] - A[i], X_i the extra allocated when module i's
// backward starts, fwd/bwd peaks above the start of each phase, H the loss's peak above A[n]).
// A plan is a sequence of units; after the units before u, the step holds base + R_u bytes,
// R_u = sum of what those units retain. Each unit has a retained size and a work size, the most
// it needs above base + R_u at any time in the step:
//
//   module i run normally:   retained = kept_i
//                            work = max(fwd_peak_i, kept_i + X_i + bwd_peak_i)
//   segment [b, e):          retained = out_{e-1}; its input is already counted in R_b and
//                            nothing inside is kept (forward runs without a graph)
//                            work = max of
//                              forward (no graph): max_k (out_{k-1} [k > b] + fwd_peak_k)
//                              recompute in backward: X_{e-1} + F_{e-1}
//                                        + max_k (sum_{b<=j<k} kept_j + fwd_peak_k)
//                            (F_{e-1}: the part of kept_{e-1} the unchecked run had already
//                            freed when module e-1's backward began, already netted out of X)
//                              backward: max_i (sum_{b<=j<=i} kept_j + X_i + bwd_peak'_i
//                                               + out_{e-1} [i < e-1])
//                            (the gradient of the segment's output stays referenced by the
//                            checkpoint's backward until it returns: the modules before the
//                            last carry it as out_{e-1}; for the last, bwd_peak' is its peak
//                            measured with its incoming gradient held, bwd_peak_held)
//
// peak = base + max(max_u (R_u + work_u), R_end + H); recompute time = sum of fwd_ns over
// checkpointed modules; step = fwd_bwd_ns + recompute. For the plan "none" this reproduces the
// profiled step's peak exactly: the phases measured tile the step. The approximations are the
// no-graph forward of a segment (bounded by the graph-building peak) and X inside a segment
// (taken from the unchecked run: the same gradients are in flight at the same point).
#include "gpumem/ckpt/planner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

namespace gpumem::ckpt {
namespace {

constexpr std::int64_t kNoBudget = std::numeric_limits<std::int64_t>::max();

struct UnitCost {
  std::int64_t retained_bytes = 0;
  std::int64_t work_bytes = 0;
  double recompute_ns = 0;
};

UnitCost normal_unit(const ChainProfile& p, std::size_t i) {
  const ModuleProfile& m = p.modules[i];
  return {m.kept_bytes,
          std::max(m.fwd_peak_bytes, m.kept_bytes + m.bwd_extra_bytes + m.bwd_peak_bytes), 0.0};
}

// The cost of a checkpointed segment [b, e), grown one module at a time (add(k) for
// k = b, b+1, ...) with running maxima, so all segments starting at b cost O(n) together.
class SegmentAccumulator {
 public:
  SegmentAccumulator(const ChainProfile& p, std::size_t begin) : p_(p), begin_(begin) {}

  // Extends the segment by module k (the next one) and returns the cost of [begin, k + 1).
  UnitCost add(std::size_t k) {
    const ModuleProfile& m = p_.modules[k];
    const std::int64_t in_bytes = k > begin_ ? p_.modules[k - 1].output_bytes : 0;
    fwd_max_ = std::max(fwd_max_, in_bytes + m.fwd_peak_bytes);
    recompute_max_ = std::max(recompute_max_, kept_before_ + m.fwd_peak_bytes);
    kept_before_ += m.kept_bytes;
    // The segment's backward holds the gradient of the segment's output until it returns
    // (autograd passes it to the checkpoint by reference): the last module backpropagates with
    // its incoming gradient held (bwd_peak_held), the ones before it with that gradient extra.
    bwd_inner_max_ = std::max(bwd_inner_max_, bwd_last_plain_);
    const std::int64_t base = kept_before_ + m.bwd_extra_bytes;
    bwd_last_plain_ = base + m.bwd_peak_bytes;
    const std::int64_t last = base + std::max(m.bwd_peak_bytes, m.bwd_peak_held_bytes);
    const std::int64_t bwd =
        std::max(last, k > begin_ ? bwd_inner_max_ + m.output_bytes : std::int64_t{0});
    ns_ += m.fwd_ns;
    // The recompute runs while what X_k counts is allocated; X_k was measured net of the parts
    // of kept_k already freed (F_k), which the recompute has not freed yet.
    const std::int64_t recompute = m.bwd_extra_bytes + m.freed_before_bwd_bytes + recompute_max_;
    return {m.output_bytes, std::max({fwd_max_, recompute, bwd}), ns_};
  }

 private:
  const ChainProfile& p_;
  std::size_t begin_;
  std::int64_t fwd_max_ = 0, recompute_max_ = 0, kept_before_ = 0;
  std::int64_t bwd_inner_max_ = 0;   // backward terms of the modules before the last
  std::int64_t bwd_last_plain_ = 0;  // backward term of the last module, gradient not held
  double ns_ = 0;
};

UnitCost segment_unit(const ChainProfile& p, std::size_t begin, std::size_t end) {
  SegmentAccumulator acc(p, begin);
  UnitCost c;
  for (std::size_t k = begin; k < end; ++k) c = acc.add(k);
  return c;
}

// One DP state: the plan of a prefix, as (R, P, C) plus a back pointer.
struct Node {
  std::int64_t retained = 0;  // R
  std::int64_t peak = 0;      // P, above base
  double recompute_ns = 0;    // C
  std::int64_t parent = -1;   // node index of the prefix before the last unit
  std::size_t unit_begin = 0;
  bool checkpointed = false;  // the last unit is a segment [unit_begin, position)
};

enum class Objective { least_recompute, least_peak };

// A staircase of DP states at one chain position, for one objective. For least recompute
// under a budget, a state that fits the budget so far stays feasible or not depending only on
// R (later units add R + work), and C only adds up: (R, C) decide, P only breaks ties. For the
// least peak, the final peak is max(P, later terms growing with R): (R, P) decide, C only
// breaks ties. A state no better in R and in its cost than a kept one is useless, so the kept
// states, sorted by R, have strictly falling cost: a staircase, searched by bisection. This
// keeps the search exact for the objective.
class Staircase {
 public:
  struct Entry {
    std::int64_t retained;
    double cost;
    double tie;
    std::int64_t node;
  };

  // Keeps the state unless a kept one is at least as good; drops the kept ones it beats.
  bool offer(const Entry& cand) {
    auto by_r = [](const Entry& e, std::int64_t r) { return e.retained < r; };
    auto first_ge = std::lower_bound(steps_.begin(), steps_.end(), cand.retained, by_r);
    auto first_gt = std::upper_bound(steps_.begin(), steps_.end(), cand.retained,
                                     [](std::int64_t r, const Entry& e) { return r < e.retained; });
    if (first_gt != steps_.begin()) {
      const Entry& prev = *(first_gt - 1);  // the cheapest with R <= cand's R
      if (prev.cost < cand.cost) return false;
      if (prev.cost == cand.cost &&
          (prev.retained < cand.retained || prev.tie <= cand.tie)) {
        return false;
      }
    }
    auto last = first_ge;  // kept states with R >= cand's R and cost >= cand's are beaten
    while (last != steps_.end() && last->cost >= cand.cost) ++last;
    steps_.insert(steps_.erase(first_ge, last), cand);
    return true;
  }

  const std::vector<Entry>& entries() const noexcept { return steps_; }

 private:
  std::vector<Entry> steps_;
};

PlanResult search(const ChainProfile& p, std::int64_t budget_bytes, Objective objective) {
  const std::size_t n = p.size();
  std::vector<Node> nodes;
  std::vector<Staircase> frontier(n + 1);
  nodes.push_back(Node{});
  frontier[0].offer({0, 0.0, 0.0, 0});
  const std::int64_t room = budget_bytes == kNoBudget ? kNoBudget : budget_bytes - p.base_bytes;

  auto offer = [&](std::size_t pos, const Node& cand) {
    if (cand.peak > room) return;  // already over budget: no extension can recover
    const auto peak = static_cast<double>(cand.peak);
    const bool recompute = objective == Objective::least_recompute;
    const Staircase::Entry e{cand.retained, recompute ? cand.recompute_ns : peak,
                             recompute ? peak : cand.recompute_ns,
                             static_cast<std::int64_t>(nodes.size())};
    if (frontier[pos].offer(e)) nodes.push_back(cand);
  };

  std::vector<UnitCost> seg;  // seg[e - i - 1]: cost of the segment [i, e)
  for (std::size_t i = 0; i < n; ++i) {
    seg.clear();
    SegmentAccumulator acc(p, i);
    for (std::size_t k = i; k < n; ++k) seg.push_back(acc.add(k));
    const UnitCost plain = normal_unit(p, i);
    for (const Staircase::Entry& entry : frontier[i].entries()) {  // offers go to later ones
      const std::int64_t id = entry.node;
      const Node s = nodes[static_cast<std::size_t>(id)];
      offer(i + 1, Node{s.retained + plain.retained_bytes,
                        std::max(s.peak, s.retained + plain.work_bytes), s.recompute_ns, id, i,
                        false});
      for (std::size_t e = i + 1; e <= n; ++e) {
        const UnitCost& c = seg[e - i - 1];
        offer(e, Node{s.retained + c.retained_bytes, std::max(s.peak, s.retained + c.work_bytes),
                      s.recompute_ns + c.recompute_ns, id, i, true});
      }
    }
  }

  PlanResult result;
  for (const auto& f : frontier) result.states += f.entries().size();
  std::int64_t best = -1;
  std::int64_t best_peak = 0;
  for (const Staircase::Entry& entry : frontier[n].entries()) {
    const std::int64_t id = entry.node;
    const Node& s = nodes[static_cast<std::size_t>(id)];
    const std::int64_t peak = std::max(s.peak, s.retained + p.head_peak_bytes);
    if (peak > room) continue;
    bool better = false;
    if (best < 0) {
      better = true;
    } else {
      const Node& b = nodes[static_cast<std::size_t>(best)];
      better = objective == Objective::least_recompute
                   ? (s.recompute_ns < b.recompute_ns ||
                      (s.recompute_ns == b.recompute_ns && peak < best_peak))
                   : (peak < best_peak || (peak == best_peak && s.recompute_ns < b.recompute_ns));
    }
    if (better) {
      best = id;
      best_peak = peak;
    }
  }
  if (best < 0) return result;  // infeasible

  // Walk the path forward: a unit ends where the next one begins (the last one at n).
  std::vector<std::int64_t> path;
  for (std::int64_t id = best; id >= 0; id = nodes[static_cast<std::size_t>(id)].parent) {
    path.push_back(id);
  }
  std::reverse(path.begin(), path.end());  // path[0] is the empty prefix
  std::vector<Segment> segs;
  for (std::size_t k = 1; k < path.size(); ++k) {
    const Node& s = nodes[static_cast<std::size_t>(path[k])];
    const std::size_t end = k + 1 < path.size()
                                ? nodes[static_cast<std::size_t>(path[k + 1])].unit_begin
                                : n;
    if (s.checkpointed) segs.push_back({s.unit_begin, end});
  }
  result.feasible = true;
  result.plan = Plan(n, std::move(segs));
  result.prediction = predict(p, result.plan);
  return result;
}

}  // namespace

Prediction predict(const ChainProfile& p, const Plan& plan) {
  if (plan.n_modules() != p.size()) {
    throw std::invalid_argument(fmt::format(
        "predict: the plan is for {} modules but the profile has {}; plan with the profile of "
        "the same chain",
        plan.n_modules(), p.size()));
  }
  Prediction out;
  std::int64_t retained = 0, peak = 0;
  const auto& segs = plan.checkpointed();
  std::size_t next_seg = 0;
  for (std::size_t i = 0; i < p.size();) {
    UnitCost u;
    std::size_t next = i + 1;
    if (next_seg < segs.size() && segs[next_seg].begin == i) {
      u = segment_unit(p, i, segs[next_seg].end);
      next = segs[next_seg].end;
      ++next_seg;
    } else {
      u = normal_unit(p, i);
    }
    peak = std::max(peak, retained + u.work_bytes);
    retained += u.retained_bytes;
    out.recompute_ns += u.recompute_ns;
    i = next;
  }
  peak = std::max(peak, retained + p.head_peak_bytes);
  out.peak_bytes = p.base_bytes + peak;
  out.retained_bytes = retained;
  out.step_ns = p.fwd_bwd_ns + out.recompute_ns;
  return out;
}

PlanResult plan_min_peak(const ChainProfile& profile) {
  PlanResult r = search(profile, kNoBudget, Objective::least_peak);
  r.min_peak_bytes = r.prediction.peak_bytes;
  return r;
}

PlanResult plan_for_budget(const ChainProfile& profile, std::int64_t budget_bytes) {
  PlanResult r = search(profile, budget_bytes, Objective::least_recompute);
  if (r.feasible) return r;
  PlanResult lowest = plan_min_peak(profile);
  lowest.feasible = false;
  lowest.states += r.states;
  lowest.message = fmt::format(
      "no checkpoint plan fits a budget of {} ({} bytes): the lowest predicted peak is {} ({} "
      "bytes, plan {}); raise the budget to at least that, or make the chain finer so smaller "
      "segments can be recomputed",
      format_bytes(budget_bytes), budget_bytes, format_bytes(lowest.min_peak_bytes),
      lowest.min_peak_bytes, lowest.plan.to_string());
  return lowest;
}

std::string format_bytes(std::int64_t bytes) {
  const double b = static_cast<double>(bytes);
  const double a = std::fabs(b);
  if (a >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (a >= double(1ull << 20)) return fmt::format("{:.1f} MiB", b / double(1ull << 20));
  if (a >= double(1ull << 10)) return fmt::format("{:.1f} KiB", b / double(1ull << 10));
  return fmt::format("{} B", bytes);
}

std::int64_t parse_bytes(const std::string& text) {
  auto fail = [&]() -> std::int64_t {
    throw std::invalid_argument(fmt::format(
        "'{}' is not a byte count; write a number with an optional unit: 123, 64kB, 512MiB, "
        "1.5GB, 16GiB (kB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024)",
        text));
  };
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(text, &pos);
  } catch (const std::exception&) {
    return fail();
  }
  std::string unit = text.substr(pos);
  std::erase_if(unit, [](unsigned char c) { return std::isspace(c); });
  double scale = 0;
  if (unit.empty() || unit == "B") scale = 1;
  else if (unit == "kB" || unit == "KB") scale = 1e3;
  else if (unit == "MB") scale = 1e6;
  else if (unit == "GB") scale = 1e9;
  else if (unit == "TB") scale = 1e12;
  else if (unit == "KiB") scale = double(1ull << 10);
  else if (unit == "MiB") scale = double(1ull << 20);
  else if (unit == "GiB") scale = double(1ull << 30);
  else if (unit == "TiB") scale = double(1ull << 40);
  else return fail();
  const double bytes = value * scale;
  if (!(bytes >= 0) || bytes > 9.0e18) return fail();
  return static_cast<std::int64_t>(std::llround(bytes));
}

std::string format_profile(const ChainProfile& p) {
  std::string out = fmt::format(
      "profile ({} modules, probe {}): base {}, loss peak {}, measured peak {}, fwd+bwd {:.2f} "
      "ms\n",
      p.size(), p.probe, format_bytes(p.base_bytes), format_bytes(p.head_peak_bytes),
      format_bytes(p.measured_peak_bytes), p.fwd_bwd_ns / 1e6);
  out += fmt::format(
      "{:>4} {:<18} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9} {:>9}\n", "#",
      "module", "kept", "output", "fwd peak", "bwd extra", "bwd peak", "held peak", "freed",
      "fwd ms", "bwd ms");
  for (std::size_t i = 0; i < p.size(); ++i) {
    const ModuleProfile& m = p.modules[i];
    out += fmt::format(
        "{:>4} {:<18} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>11} {:>9.3f} {:>9.3f}\n", i,
        m.name.substr(0, 18), format_bytes(m.kept_bytes), format_bytes(m.output_bytes),
        format_bytes(m.fwd_peak_bytes), format_bytes(m.bwd_extra_bytes),
        format_bytes(m.bwd_peak_bytes), format_bytes(m.bwd_peak_held_bytes),
        format_bytes(m.freed_before_bwd_bytes), m.fwd_ns / 1e6, m.bwd_ns / 1e6);
  }
  return out;
}

}  // namespace gpumem::ckpt
