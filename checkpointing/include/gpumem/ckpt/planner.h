// The checkpoint planner: given a ChainProfile and a budget on peak allocated bytes, choose the
// checkpointed segments that fit the budget with the least recompute time.
//
// See Note [Checkpoint cost model] in planner.cpp for how a plan's peak and step time are
// predicted from the profile. The search is an exact dynamic program over the chain: a plan is
// a sequence of units (one module run normally, or a checkpointed segment [b, e)); after a
// prefix of units the future depends only on R (bytes those units keep) and what they cost so
// far: C (recompute time) when looking for the least recompute under a budget (any prefix over
// the budget is dropped), P (the largest peak reached) when looking for the least peak. A state
// no better in R and no better in its cost than another is dropped, and nothing better is lost.
// Each position keeps a staircase of states; O(n^2 * staircase) time.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gpumem/ckpt/chain_profile.h"
#include "gpumem/ckpt/plan.h"

namespace gpumem::ckpt {

struct Prediction {
  std::int64_t peak_bytes = 0;      // predicted peak allocated over a training step
  std::int64_t retained_bytes = 0;  // kept for backward at the end of the chain's forward
  double recompute_ns = 0;          // extra forward time spent recomputing segments
  double step_ns = 0;               // profile.fwd_bwd_ns + recompute_ns
};

// Predicts a plan's peak and step time from the profile. Throws std::invalid_argument if the
// plan was made for a chain of another length.
Prediction predict(const ChainProfile& profile, const Plan& plan);

struct PlanResult {
  bool feasible = false;   // some plan fits the budget
  Plan plan;               // least recompute among those that fit (ties: lower peak); when
                           // infeasible, the plan with the lowest predicted peak
  Prediction prediction;   // of `plan`
  std::int64_t min_peak_bytes = 0;  // lowest peak any plan reaches (set when infeasible)
  std::size_t states = 0;  // DP states kept, summed over positions (for the curious)
  std::string message;     // when infeasible: the budget, the lowest reachable peak, the fix
};

// Chooses the plan of least recompute whose predicted peak is <= budget_bytes.
PlanResult plan_for_budget(const ChainProfile& profile, std::int64_t budget_bytes);

// The plan with the lowest predicted peak (ties: least recompute).
PlanResult plan_min_peak(const ChainProfile& profile);

// "12.3 GiB"-style formatting of a byte count (signed).
std::string format_bytes(std::int64_t bytes);

// Parses "123", "1.5GB", "2GiB", "512MiB", "64kB" (decimal kB/MB/GB/TB, binary KiB/MiB/GiB/TiB).
// Throws std::invalid_argument naming the text and the accepted forms.
std::int64_t parse_bytes(const std::string& text);

}  // namespace gpumem::ckpt
