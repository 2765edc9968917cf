// Recycle budget: how much of the elapsed time the engine may spend moving physical pieces
// (physical page recycling: unmap a wholly free piece, map it where a request lands). A token
// bucket of driver time: it fills at `fraction` x elapsed time, holds at most `burst_ns`, starts
// full, and every recycled piece's unmap + map time is taken out of it. While it is empty (or in
// debt), growth creates new pieces instead of moving free ones; the new memory stays cached, so a
// growth that repeats every step stops costing driver calls once the footprint covers it, instead
// of moving the same pieces back and forth each step. See Note [Allocation policy]
// (docs/notes/allocation-policy.md, "The recycle budget") for the corpus it was measured on.
//
// The memory guard: growth past the budget may create new memory only while what it bought so far
// stays within `slack` x the rest of the footprint; past that, recycling goes on whatever it costs
// (memory comes first), so the budget can give back at most that share of the memory recycling
// wins. What it bought is an estimate of the counterfactual (bought_estimate): the memory reserved
// beyond what recycling alone would have reserved.
//
// Time comes from the caller: the live engine passes its source's clock and the measured driver
// time; the replay passes the traced time plus the cost model's time for the calls it made, so a
// replay stays deterministic.
//
// Invariants: tokens_ns() <= burst_ns; fraction >= 1 (unlimited) never denies.
// Thread-safety: a plain value; the engine keeps one under its lock.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cap_policy.h"

namespace gpumem::alloc::policy {

struct RecycleBudgetRules {
  // Share of elapsed time recycling may spend, in (0, 1]; 1 = no budget (recycling is never
  // denied for its cost).
  double fraction = 1.0;
  // What the bucket starts with and holds at most: the warm-up (building the footprint, where
  // recycling wins most of its memory) spends it; steady state then runs on `fraction`.
  std::int64_t burst_ns = 0;
  // The memory guard: the most memory growth past the budget may add, as a share of the rest of
  // the footprint (within_slack).
  double slack = 0.0;
  // The guard's second bound (within_guard): growth past the budget buys memory only while the
  // footprint stays within (1 + ceiling) x the most memory ever in use; 0 = no such bound.
  double ceiling = 0.0;
  // The churn allowance (ChurnMeter): while recycling's driver calls take at least `churn` of the
  // recent time, the guard's slack and ceiling are each `churn_allowance` higher. 0 = off.
  double churn = 0.0;
  double churn_allowance = 0.0;
  bool unlimited() const noexcept { return !(fraction < 1.0); }
  // No time at all for recycling (fraction 0, no burst): every growth goes to the memory guard,
  // and the clock need not be read.
  bool none() const noexcept { return !(fraction > 0.0) && burst_ns <= 0; }
};

// The memory the budget has bought so far: the footprint beyond what recycling alone would have
// reserved. Two upper bounds of it, the smaller taken:
//  - counted_bytes: what growth past the budget created beyond its own recycling plan, growth by
//    growth. It over-counts while the footprint is still being built: a piece kept where it was
//    instead of moved leaves nothing for the next request there to take, but a piece moved would
//    have left a hole that the next request there grows into, and growth then creates anyway
//    (recycling alone would have created that memory too, a little later).
//  - reserved_bytes - in_use_high_bytes: recycling alone reserves at least the most memory ever in
//    use at once (allocated and pending blocks, the request being grown for included), so the
//    budget cannot have bought more than the footprint beyond it.
// The first alone stopped the budget during the first step of the replayed llama_train trace: it
// counted 464 MiB (1.9% of the footprint) where the footprint ended 12 MiB above recycling alone's
// (docs/notes/allocation-policy.md, "The guard's estimate of bought memory").
std::size_t bought_estimate(std::size_t counted_bytes, std::size_t reserved_bytes,
                            std::size_t in_use_high_bytes) noexcept;

// Whether growth past the budget may create adding_bytes more, having created bought_bytes so far
// past it, with reserved_bytes reserved now (bought included): bought + adding <= slack x (reserved
// - bought).
bool within_slack(std::size_t bought_bytes, std::size_t adding_bytes, std::size_t reserved_bytes,
                  double slack) noexcept;

// The memory guard, both bounds together: growth past the budget may buy adding_bytes (create
// them instead of moving free pieces) iff within_slack(bought_bytes, adding_bytes, reserved_bytes,
// slack) and, with ceiling > 0, the footprint after the growth, reserved_bytes + created_bytes
// (what the growth creates in all without recycling), stays within (1 + ceiling) x
// in_use_high_bytes. The first bound counts purchases on top of whatever recycling alone reserves;
// on a small, granule-bound footprint (always a few percent above the memory in use) that is
// memory added to an already high ratio. The second lets the guard buy only while the footprint is
// close to what the program has needed. Note [Allocation policy], "The guard's ceiling".
bool within_guard(std::size_t bought_bytes, std::size_t adding_bytes, std::size_t created_bytes,
                  std::size_t reserved_bytes, std::size_t in_use_high_bytes, const RecycleBudgetRules& rules) noexcept;

// The headroom rule: whether a growth may create adding_bytes instead of moving free pieces, with
// reserved_bytes reserved now and in_use_high_bytes the most memory ever in use (the request being
// grown for included): reserved + adding <= (1 + headroom) x in_use_high. While the footprint
// stays that close to what the program has needed, new memory costs little, and moving pieces
// (which leaves holes whose edges strand partly used granules, and moves again every step on a
// workload whose shapes repeat) is not worth it; past it, recycling keeps the footprint down.
// headroom 0 turns the rule off (growth always recycles first). Note [Allocation policy],
// "Recycling only above the headroom".
bool within_headroom(std::size_t reserved_bytes, std::size_t adding_bytes, std::size_t in_use_high_bytes,
                     double headroom) noexcept;

// recycle_wait:fence: whether a growth that fences kept from moving some pieces (their memory not
// yet known idle on the GPU) may create adding_bytes instead of waiting for them, with
// reserved_bytes reserved now and in_use_high_bytes the most memory ever in use (the request
// included): reserved + adding <= in_use_high. Recycling alone reserves at least the most memory
// ever in use, so within it the new memory is memory the program needs anyway; past it, the growth
// waits (moves the pieces). A growth that creates nothing always may. Replayed on the corpus a
// looser bound (1.5% over in_use_high, the guard's ceiling) moved peaks up on 3 traces
// (Note [Physical page recycling], "Fences instead of waits").
bool fence_may_create(std::size_t reserved_bytes, std::size_t adding_bytes, std::size_t in_use_high_bytes) noexcept;

// The churn meter (recycle_churn): how much of the recent time recycling's driver calls took, and
// whether the churn allowance is open. The share is an exponentially decaying sum of the driver
// time of the moves, with a time constant of kWindowNs, over kWindowNs: a steady rate r of driver
// time per unit of time reads r. The allowance opens when the share reaches `rules.churn` and closes
// when it falls below a quarter of that; while it is open the memory guard may buy
// `rules.churn_allowance` more of both its bounds (`allowed_rules`). A program that spends a third
// of its time moving the same pieces back and forth is better served by a few percent more memory
// (docs/notes/allocation-policy.md, "The churn allowance"). Time comes from the caller, as for
// RecycleBudget (the replay's is traced time plus the modelled calls, so replays stay
// deterministic); a clock that stands still (SimSource) never opens it.
class ChurnMeter {
 public:
  static constexpr std::int64_t kWindowNs = 100'000'000;

  // spent_ns of recycling's driver time, ending at now_ns.
  void note_recycling(std::int64_t now_ns, std::int64_t spent_ns) noexcept;
  // The share of the recent time that recycling took, decayed to now_ns.
  double share(std::int64_t now_ns) const noexcept;
  // Updates and returns whether the allowance is open at now_ns under `rules` (churn or
  // churn_allowance 0: never).
  bool open(std::int64_t now_ns, const RecycleBudgetRules& rules) noexcept;
  // `rules` with the allowance added to the guard's slack (at most 1) and ceiling (a ceiling of 0
  // stays 0: no bound).
  static RecycleBudgetRules allowed_rules(const RecycleBudgetRules& rules) noexcept;
  std::uint64_t openings() const noexcept { return openings_; }

 private:
  double level_ns_ = 0;         // decayed sum of recycling's driver time, as of last_ns_
  std::int64_t last_ns_ = 0;
  bool open_ = false;
  std::uint64_t openings_ = 0;  // times the allowance opened
};

// The memory guard's whole decision for a growth the budget keeps from recycling, which would
// create `buying_bytes` more than the same growth with recycling (`created_bytes` in all without
// recycling; `bought_bytes` bought so far, policy::bought_estimate): whether it must recycle
// anyway. It must when creating would pass the cap (`cap_bytes`, cap_policy.h), and when the guard
// refuses (within_guard) unless the churn allowance is open and the guard's wider bounds
// (ChurnMeter::allowed_rules) accept. A growth that buys nothing never must. `churn_open` is asked
// (it reads the clock and updates the meter) only when the usual bounds refuse and `rules.churn`
// is on, so the common growth reads no clock. Note [Allocation policy], "The churn allowance".
struct GuardInputs {
  std::size_t bought_bytes = 0;       // bought so far (bought_estimate)
  std::size_t buying_bytes = 0;       // this growth's purchase: created without recycling - with it
  std::size_t created_bytes = 0;      // what this growth creates without recycling
  std::size_t reserved_bytes = 0;     // reserved now
  std::size_t in_use_high_bytes = 0;  // the most memory ever in use, the request included
  std::size_t cap_bytes = kNoLimit;   // the cap (kNoLimit: none)
};
template <class ChurnOpen>
bool guard_forces_recycling(const GuardInputs& in, const RecycleBudgetRules& rules, ChurnOpen&& churn_open) {
  if (in.buying_bytes == 0) return false;
  if (exceeds_cap(in.reserved_bytes, in.created_bytes, in.cap_bytes)) return true;
  const auto refuses = [&](const RecycleBudgetRules& guard) {
    return !within_guard(in.bought_bytes, in.buying_bytes, in.created_bytes, in.reserved_bytes, in.in_use_high_bytes,
                         guard);
  };
  if (!refuses(rules)) return false;
  if (!(rules.churn > 0.0) || !churn_open()) return true;
  return refuses(ChurnMeter::allowed_rules(rules));
}

class RecycleBudget {
 public:
  RecycleBudget() = default;
  explicit RecycleBudget(const RecycleBudgetRules& rules) noexcept;

  // Refills for the time since the last call (the first call only starts the clock; a clock that
  // went backwards refills nothing), then says whether recycling may spend: the bucket is not
  // empty, or the budget is unlimited.
  bool allows(std::int64_t now_ns) noexcept;
  // Takes spent_ns of driver time out of the bucket (it may go into debt: one growth is never cut
  // short; the debt is paid back before the next recycling). Unlimited budgets ignore it.
  void charge(std::int64_t spent_ns) noexcept;

  double tokens_ns() const noexcept { return tokens_ns_; }
  std::int64_t spent_ns() const noexcept { return spent_ns_; }
  std::uint64_t denials() const noexcept { return denials_; }
  const RecycleBudgetRules& rules() const noexcept { return rules_; }

 private:
  RecycleBudgetRules rules_;
  double tokens_ns_ = 0;
  std::int64_t last_ns_ = 0;
  bool started_ = false;
  std::int64_t spent_ns_ = 0;   // charged in all
  std::uint64_t denials_ = 0;   // allows() calls that said no
};

}  // namespace gpumem::alloc::policy
