#include "gpumem/ckpt/checkpointed_sequential.h"

#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <stdexcept>

namespace gpumem::ckpt {

CheckpointedSequentialImpl::CheckpointedSequentialImpl(const torch::nn::Sequential& sequential) {
  TORCH_CHECK(!sequential.is_empty(), "CheckpointedSequential: the Sequential is empty; "
              "construct it with modules");
  const auto children = sequential->named_children();
  TORCH_CHECK(children.size() == sequential->size(),
              "CheckpointedSequential: the Sequential has ", sequential->size(),
              " modules but ", children.size(), " named children; build it with push_back");
  std::size_t i = 0;
  for (const torch::nn::AnyModule& module : *sequential) {
    push_back_any(children[i++].key(), module);
  }
}

void CheckpointedSequentialImpl::push_back_any(std::string name, torch::nn::AnyModule module) {
  TORCH_CHECK(!module.is_empty(), "CheckpointedSequential::push_back: module '", name,
              "' is empty; pass a constructed module");
  register_module(name, module.ptr());
  names_.push_back(std::move(name));
  modules_.push_back(std::move(module));
  plan_ = Plan::none(modules_.size());
}

at::Tensor CheckpointedSequentialImpl::forward_range(const at::Tensor& input, std::size_t begin,
                                                     std::size_t end) {
  at::Tensor x = input;
  for (std::size_t i = begin; i < end; ++i) x = modules_[i].forward<at::Tensor>(x);
  return x;
}

std::vector<at::Tensor> CheckpointedSequentialImpl::parameters_of(std::size_t begin,
                                                                  std::size_t end) const {
  std::vector<at::Tensor> params;
  for (std::size_t i = begin; i < end; ++i) {
    for (const at::Tensor& p : modules_[i].ptr()->parameters(/*recurse=*/true)) {
      params.push_back(p);
    }
  }
  return params;
}

at::Tensor CheckpointedSequentialImpl::forward(const at::Tensor& input) {
  TORCH_CHECK(plan_.n_modules() == modules_.size(), "CheckpointedSequential: the plan is for ",
              plan_.n_modules(), " modules but there are ", modules_.size(),
              "; call set_plan after adding modules");
  if (!at::GradMode::is_enabled() || plan_.checkpointed().empty()) {
    return forward_range(input, 0, modules_.size());
  }
  at::Tensor x = input;
  std::size_t i = 0;
  for (const Segment& s : plan_.checkpointed()) {
    x = forward_range(x, i, s.begin);
    x = checkpoint(
        [this, s](const at::Tensor& in) { return forward_range(in, s.begin, s.end); }, x,
        parameters_of(s.begin, s.end), options_);
    i = s.end;
  }
  return forward_range(x, i, modules_.size());
}

void CheckpointedSequentialImpl::set_plan(Plan plan) {
  if (plan.n_modules() != modules_.size()) {
    throw std::invalid_argument(c10::str(
        "CheckpointedSequential::set_plan: the plan is for ", plan.n_modules(),
        " modules but the chain has ", modules_.size(),
        "; make the plan with n_modules = size()"));
  }
  plan_ = std::move(plan);
}

void CheckpointedSequentialImpl::pretty_print(std::ostream& stream) const {
  stream << "gpumem::ckpt::CheckpointedSequential(plan=" << plan_.to_string() << ")";
}

}  // namespace gpumem::ckpt
