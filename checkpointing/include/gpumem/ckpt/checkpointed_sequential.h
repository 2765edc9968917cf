// CheckpointedSequential: a drop-in for torch::nn::Sequential whose forward checkpoints the
// segments of a Plan (plan.h) with gpumem::checkpoint.
//
// Modules are registered under the names Sequential uses ("0", "1", ... unless named), so
// parameters(), named_parameters() and state dicts are the same as the Sequential it replaces.
// Every module must map one tensor to one tensor. Segments are checkpointed only while grad
// mode is enabled; otherwise (eval, no_grad) forward is a plain loop. Each checkpointed segment
// passes the parameters of its modules to checkpoint(), so gradients reach them even when the
// segment's input does not require grad.
//
// Invariant: plan().n_modules() == size() (set_plan checks; push_back resets the plan to none).
//
// clone() is not supported (torch::nn::Module's default clone() says so).
//
// Thread-safety: as torch::nn::Module (not safe to mutate while another thread runs forward).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <utility>
#include <vector>

#include "gpumem/ckpt/checkpoint.h"
#include "gpumem/ckpt/plan.h"

namespace gpumem::ckpt {

class CheckpointedSequentialImpl : public torch::nn::Module {
 public:
  CheckpointedSequentialImpl() = default;

  // Takes over the modules of a Sequential, under the same names.
  explicit CheckpointedSequentialImpl(const torch::nn::Sequential& sequential);

  // Like Sequential's variadic constructor: each argument a module holder or shared_ptr.
  template <typename... Modules>
    requires(sizeof...(Modules) > 0 &&
             !(sizeof...(Modules) == 1 &&
               (std::is_same_v<std::decay_t<Modules>, torch::nn::Sequential> && ...)))
  explicit CheckpointedSequentialImpl(Modules&&... modules) {
    (push_back(std::forward<Modules>(modules)), ...);
  }

  template <typename M>
  void push_back(M&& module) {
    push_back(std::to_string(modules_.size()), std::forward<M>(module));
  }
  template <typename M>
  void push_back(std::string name, M&& module) {
    push_back_any(std::move(name), torch::nn::AnyModule(std::forward<M>(module)));
  }
  void push_back_any(std::string name, torch::nn::AnyModule module);

  at::Tensor forward(const at::Tensor& input);

  // Runs modules [begin, end) normally (no checkpointing); the profiler uses it.
  at::Tensor forward_range(const at::Tensor& input, std::size_t begin, std::size_t end);

  void set_plan(Plan plan);
  const Plan& plan() const noexcept { return plan_; }
  void set_checkpoint_options(CheckpointOptions options) { options_ = options; }

  std::size_t size() const noexcept { return modules_.size(); }
  bool is_empty() const noexcept { return modules_.empty(); }
  const std::string& module_name(std::size_t i) const { return names_.at(i); }
  std::shared_ptr<torch::nn::Module> ptr(std::size_t i) const { return modules_.at(i).ptr(); }
  // Parameters of modules [begin, end), recursively.
  std::vector<at::Tensor> parameters_of(std::size_t begin, std::size_t end) const;

  void pretty_print(std::ostream& stream) const override;

 private:
  std::vector<torch::nn::AnyModule> modules_;
  std::vector<std::string> names_;
  Plan plan_;
  CheckpointOptions options_;
};

TORCH_MODULE(CheckpointedSequential);

}  // namespace gpumem::ckpt
