// gpumem::zero::call(unit, args...): runs a module's forward as a stage-3 unit.
//
// libtorch modules have no forward hooks, so a model trained with ZeRO stage 3 calls each unit
// it passed to the ShardedTrainer through call() instead of unit->forward():
//
//     x = gpumem::zero::call(blocks[i], x);       // instead of blocks[i]->forward(x)
//
// Around forward, call() (1) gathers the unit's parameters, waiting for a prefetch if one is in
// flight, and prefetches the next unit; (2) hooks every output tensor that requires grad so the
// unit is gathered again before its backward; (3) frees the gathered parameters when the trainer
// reshards after forward, or when no output needs backward (no grad mode, eval).
//
// For a module that is not a stage-3 unit of a live trainer (stages 0-2, no trainer, a plain
// submodule) call() is exactly module->forward(args...), so models can always use it.
// Supported forward results: a Tensor, or a std::tuple / std::pair / std::vector of Tensors.
//
// Thread-safety: as the trainer's (the thread that drives the trainer runs the forward).
#pragma once

#include <torch/nn/module.h>

#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace gpumem::zero {

namespace detail {

class TrainerCore;

// The bookkeeping of one call(): finds the trainer unit `module` belongs to (if any), gathers
// on construction, and finish() reshards. If forward throws, the destructor reshards quietly.
class UnitForwardScope {
 public:
  explicit UnitForwardScope(const torch::nn::Module* module);
  ~UnitForwardScope();
  UnitForwardScope(const UnitForwardScope&) = delete;
  UnitForwardScope& operator=(const UnitForwardScope&) = delete;

  void watch_output(const at::Tensor& output);
  void finish();

 private:
  std::shared_ptr<TrainerCore> core_;  // null: not a stage-3 unit, nothing to do
  int unit_ = -1;
  bool hooked_ = false;
  bool finished_ = false;
};

template <class T>
inline constexpr bool kUnsupportedOutput = false;

template <class T>
void watch_outputs(UnitForwardScope& scope, const T& out) {
  if constexpr (std::is_convertible_v<const T&, const at::Tensor&>) {
    scope.watch_output(out);
  } else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
    for (const at::Tensor& t : out) scope.watch_output(t);
  } else if constexpr (requires { std::tuple_size<T>::value; }) {
    std::apply([&](const auto&... parts) { (watch_outputs(scope, parts), ...); }, out);
  } else {
    static_assert(kUnsupportedOutput<T>,
                  "gpumem::zero::call supports forward results that are a Tensor or a tuple, "
                  "pair or vector of Tensors");
  }
}

}  // namespace detail

// `module` is a ModuleHolder (torch::nn::Linear, TORCH_MODULE types) or a std::shared_ptr to a
// module; returns what its forward returns.
template <class M, class... Args>
auto call(M& module, Args&&... args) {
  detail::UnitForwardScope scope(&*module);
  auto out = module->forward(std::forward<Args>(args)...);
  detail::watch_outputs(scope, out);
  scope.finish();
  return out;
}

}  // namespace gpumem::zero
