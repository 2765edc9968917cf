// Plan: which consecutive runs of a sequential chain of n modules are checkpointed.
//
// A checkpointed segment [begin, end) runs its modules in forward without building an autograd
// graph, keeps only its input (and its output, which the next module receives), and runs them
// again with grad enabled when backward reaches it. Modules outside every segment run normally.
//
// Invariants (checked by the constructor, which throws std::invalid_argument naming the problem):
// segments are non-empty, sorted, disjoint and inside [0, n_modules).
//
// Thread-safety: a plain value; const members may be called concurrently.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace gpumem::ckpt {

struct Segment {
  std::size_t begin = 0;  // first module of the segment
  std::size_t end = 0;    // one past the last module
  std::size_t size() const noexcept { return end - begin; }
  friend bool operator==(const Segment&, const Segment&) = default;
};

class Plan {
 public:
  Plan() = default;
  Plan(std::size_t n_modules, std::vector<Segment> checkpointed);

  // Nothing checkpointed.
  static Plan none(std::size_t n_modules);
  // Every module of [first, last) its own checkpointed segment (last = 0 means n_modules).
  static Plan every(std::size_t n_modules, std::size_t first = 0, std::size_t last = 0);
  // Chen et al.'s baseline: [first, last) cut into ceil(sqrt(m)) checkpointed segments of
  // near-equal length, m = last - first (last = 0 means n_modules).
  static Plan sqrt_n(std::size_t n_modules, std::size_t first = 0, std::size_t last = 0);
  // Each group of `group` consecutive modules of [first, last) one checkpointed segment (a
  // transformer layer made of several chain modules, for example).
  static Plan grouped(std::size_t n_modules, std::size_t group, std::size_t first = 0,
                      std::size_t last = 0);

  std::size_t n_modules() const noexcept { return n_modules_; }
  const std::vector<Segment>& checkpointed() const noexcept { return segments_; }
  std::size_t checkpointed_modules() const noexcept;
  // The segment module i belongs to, or nullptr when it runs normally.
  const Segment* segment_of(std::size_t module) const noexcept;

  // "none" or e.g. "ckpt[1,3) ckpt[5,6)" (half-open module ranges).
  std::string to_string() const;
  // The inverse of to_string (spaces optional). Throws std::invalid_argument naming the text.
  static Plan parse(std::size_t n_modules, const std::string& text);

  friend bool operator==(const Plan&, const Plan&) = default;

 private:
  std::size_t n_modules_ = 0;
  std::vector<Segment> segments_;
};

}  // namespace gpumem::ckpt
