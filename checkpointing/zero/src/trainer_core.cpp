#include "trainer_core.h"

#include "gpumem/zero/error_message.h"
#include "gpumem/zero/sharded_trainer.h"
#include "gpumem/zero/unit_call.h"

#include <c10/core/GradMode.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

namespace gpumem::zero::detail {
namespace {

// AccumulateGrad post hook: tells the core that a parameter's gradient for this backward is
// complete. Holds the core weakly: a graph outliving its trainer calls nothing.
class GradReadyHook final : public torch::autograd::PostAccumulateGradHook {
 public:
  GradReadyHook(std::weak_ptr<TrainerCore> core, int unit, int slot)
      : core_(std::move(core)), unit_(unit), slot_(slot) {}
  void operator()(const torch::autograd::Variable& param) override {
    if (auto core = core_.lock()) core->on_grad_ready(unit_, slot_, param);
  }

 private:
  std::weak_ptr<TrainerCore> core_;
  int unit_;
  int slot_;
};

std::size_t full_bytes(const FlatUnit& u) {
  return static_cast<std::size_t>(u.padded_numel) * u.full_params.itemsize();
}

const char* dtype_name(c10::ScalarType t) { return c10::toString(t); }

}  // namespace

// ---------------------------------------------------------------------------------------------
// Construction

TrainerCore::TrainerCore(std::shared_ptr<torch::nn::Module> model,
                         c10::intrusive_ptr<c10d::Backend> comm, ShardedTrainerOptions options,
                         std::vector<std::shared_ptr<torch::nn::Module>> units)
    : model_(std::move(model)), comm_(std::move(comm)), options_(options), streams_(at::kCPU) {
  if (!model_) throw std::invalid_argument("ShardedTrainer: the model is null");
  if (!comm_) {
    throw std::invalid_argument(
        "ShardedTrainer: the c10d backend is null; create one with init_distributed()");
  }
  rank_ = comm_->getRank();
  world_size_ = comm_->getSize();
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw std::invalid_argument(fmt::format(
        "ShardedTrainer: the backend reports rank {} of world size {}", rank_, world_size_));
  }
  validate_options();
  if (options_.stage == 3 && units.empty()) {
    throw std::invalid_argument(
        "ShardedTrainer: stage 3 needs units: pass the submodules whose parameters are gathered "
        "and freed together (e.g. each transformer block), and run them through "
        "gpumem::zero::call in the model's forward");
  }
  shard_count_ = options_.stage == 0 ? 1 : world_size_;
  shard_index_ = options_.stage == 0 ? 0 : rank_;
  build_units(options_.stage == 3 ? units : std::vector<std::shared_ptr<torch::nn::Module>>{});
  streams_ = DeviceStreams(device_);
}

TrainerCore::~TrainerCore() { detach(); }

void TrainerCore::validate_options() const {
  const ShardedTrainerOptions& o = options_;
  auto bad = [](const std::string& what) {
    throw std::invalid_argument("ShardedTrainerOptions: " + what);
  };
  if (o.stage < 0 || o.stage > 3)
    bad(fmt::format("stage {} does not exist: use 0, 1, 2 or 3", o.stage));
  if (o.compute_dtype == at::kHalf) {
    bad("compute_dtype kHalf needs dynamic loss scaling (fp16 gradients underflow), which "
        "ShardedTrainer does not do: use kBFloat16 (same memory, fp32's exponent range)");
  }
  if (o.compute_dtype != at::kBFloat16 && o.compute_dtype != at::kFloat) {
    bad(fmt::format("compute_dtype {} is not supported: use kBFloat16 or kFloat",
                    dtype_name(o.compute_dtype)));
  }
  const AdamWOptions& a = o.adamw;
  if (!(a.lr >= 0) || !std::isfinite(a.lr))
    bad(fmt::format("adamw.lr={} must be finite and >= 0", a.lr));
  if (!(a.beta1 >= 0 && a.beta1 < 1)) bad(fmt::format("adamw.beta1={} must be in [0, 1)", a.beta1));
  if (!(a.beta2 >= 0 && a.beta2 < 1)) bad(fmt::format("adamw.beta2={} must be in [0, 1)", a.beta2));
  if (!(a.eps > 0)) bad(fmt::format("adamw.eps={} must be > 0", a.eps));
  if (!(a.weight_decay >= 0))
    bad(fmt::format("adamw.weight_decay={} must be >= 0", a.weight_decay));
  if (!(o.max_grad_norm >= 0))
    bad(fmt::format("max_grad_norm={} must be >= 0 (0 turns clipping off)", o.max_grad_norm));
  if (o.bucket_size_bytes <= 0)
    bad(fmt::format("bucket_size_bytes={} must be > 0", o.bucket_size_bytes));
  if (o.max_inflight_reductions < 1) {
    bad(fmt::format("max_inflight_reductions={} must be >= 1", o.max_inflight_reductions));
  }
  for (std::size_t i = 0; i < o.param_groups.size(); ++i) {
    const ParamGroup& g = o.param_groups[i];
    const std::string label = fmt::format("param_groups[{}] ('{}')", i, g.name);
    if (!g.match) bad(label + ": match is empty; give it a predicate over (name, parameter)");
    if (g.lr && (!(*g.lr >= 0) || !std::isfinite(*g.lr)))
      bad(fmt::format("{}: lr={} must be finite and >= 0", label, *g.lr));
    if (g.weight_decay && !(*g.weight_decay >= 0))
      bad(fmt::format("{}: weight_decay={} must be >= 0", label, *g.weight_decay));
  }
}

int TrainerCore::group_of(const std::string& name, const at::Tensor& param) const {
  for (std::size_t i = 0; i < options_.param_groups.size(); ++i) {
    if (options_.param_groups[i].match(name, param)) return static_cast<int>(i) + 1;
  }
  return 0;
}

void TrainerCore::build_units(const std::vector<std::shared_ptr<torch::nn::Module>>& unit_modules) {
  // Parameters in registration order, each once (a tensor registered twice is one parameter).
  // Trainable ones are sharded; frozen ones (requires_grad false) stay whole (frozen_).
  std::vector<std::pair<std::string, at::Tensor>> params;
  std::vector<int> groups;  // by index in params
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_of;
  std::unordered_set<const c10::TensorImpl*> frozen_seen;
  std::optional<std::pair<std::string, at::Device>> first_device;
  for (const auto& item : model_->named_parameters(/*recurse=*/true)) {
    const at::Tensor& p = item.value();
    if (!p.defined()) continue;
    if (index_of.count(p.unsafeGetTensorImpl()) != 0) continue;
    if (frozen_seen.count(p.unsafeGetTensorImpl()) != 0) continue;
    if (!first_device) first_device.emplace(item.key(), p.device());
    if (p.device() != first_device->second) {
      throw std::invalid_argument(fmt::format(
          "ShardedTrainer: parameter '{}' is on {} but '{}' is on {}; move the whole model to "
          "one device (model->to(device)) before wrapping it",
          item.key(), p.device().str(), first_device->first, first_device->second.str()));
    }
    param_order_.push_back(item.key());
    if (!p.requires_grad()) {
      frozen_seen.insert(p.unsafeGetTensorImpl());
      frozen_.emplace_back(item.key(), p);
      continue;
    }
    if (!p.is_floating_point()) {
      throw std::invalid_argument(fmt::format(
          "ShardedTrainer: parameter '{}' has dtype {}; only floating-point parameters can be "
          "trained",
          item.key(), dtype_name(p.scalar_type())));
    }
    // Checked before anything is changed: a second trainer on the same model would otherwise
    // re-point parameters the first one manages.
    if (torch::autograd::impl::post_acc_grad_hooks(p) != nullptr) {
      throw std::invalid_argument(fmt::format(
          "ShardedTrainer: parameter '{}' already has a post-accumulate-grad hook (another "
          "trainer, or an optimizer-in-backward, manages it); wrap each model in one trainer",
          item.key()));
    }
    index_of.emplace(p.unsafeGetTensorImpl(), params.size());
    params.emplace_back(item.key(), p);
    groups.push_back(group_of(item.key(), p));
  }
  if (params.empty()) {
    throw std::invalid_argument(
        frozen_.empty()
            ? "ShardedTrainer: the model has no parameters"
            : "ShardedTrainer: every parameter of the model is frozen (requires_grad false): "
              "there is nothing to train");
  }
  device_ = params.front().second.device();
  if (!device_.is_cpu() && !device_.is_cuda()) {
    throw std::invalid_argument(fmt::format(
        "ShardedTrainer: parameters on {} are not supported: use CPU or CUDA", device_.str()));
  }
  for (const auto& [name, p] : params) num_params_ += p.numel();
  // Inside a unit, parameters are laid out group by group (stable), so a rank's shard of a unit
  // is a few runs of one group each and the optimizer works per run, not per parameter.
  auto add_sorted = [&](FlatUnit& u, std::vector<std::size_t> members) {
    std::stable_sort(members.begin(), members.end(),
                     [&](std::size_t a, std::size_t b) { return groups[a] < groups[b]; });
    for (std::size_t k : members) u.add(params[k].second, params[k].first, groups[k]);
  };

  if (options_.stage < 3) {
    // Size-bounded buckets in reverse registration order: backward produces the gradients of
    // the last layers first, so the first bucket is ready first.
    const std::int64_t bucket_numel = std::max<std::int64_t>(
        1, options_.bucket_size_bytes /
               static_cast<std::int64_t>(c10::elementSize(options_.compute_dtype)));
    std::vector<std::vector<std::size_t>> buckets;
    std::int64_t bucket_size = 0;
    for (std::size_t k = params.size(); k-- > 0;) {
      const std::int64_t n = params[k].second.numel();
      if (buckets.empty() || (bucket_size > 0 && bucket_size + n > bucket_numel)) {
        buckets.emplace_back();
        bucket_size = 0;
      }
      buckets.back().push_back(k);
      bucket_size += n;
    }
    for (std::vector<std::size_t>& members : buckets) {
      units_.emplace_back();
      units_.back().name = fmt::format("bucket {}", units_.size() - 1);
      add_sorted(units_.back(), std::move(members));
    }
  } else {
    std::unordered_map<const torch::nn::Module*, std::string> module_names;
    for (const auto& item : model_->named_modules("", /*include_self=*/true)) {
      module_names.emplace(item.value().get(), item.key().empty() ? "(model)" : item.key());
    }
    std::vector<int> owner(params.size(), -1);
    std::unordered_set<const torch::nn::Module*> seen_modules;
    for (std::size_t i = 0; i < unit_modules.size(); ++i) {
      const torch::nn::Module* m = unit_modules[i].get();
      if (m == nullptr)
        throw std::invalid_argument(fmt::format("ShardedTrainer: unit {} is null", i));
      auto name = module_names.find(m);
      if (name == module_names.end()) {
        throw std::invalid_argument(fmt::format(
            "ShardedTrainer: unit {} ({}) is not a submodule of the model; pass modules "
            "registered in the model (register_module)",
            i, m->name()));
      }
      if (!seen_modules.insert(m).second) {
        throw std::invalid_argument(
            fmt::format("ShardedTrainer: unit '{}' is listed twice", name->second));
      }
      FlatUnit u;
      u.name = name->second;
      u.module = m;
      const int index = static_cast<int>(units_.size());
      std::vector<std::size_t> mine;
      std::size_t frozen_members = 0;
      for (const at::Tensor& p : unit_modules[i]->parameters(/*recurse=*/true)) {
        auto found = index_of.find(p.unsafeGetTensorImpl());
        if (found == index_of.end()) {  // frozen: stays whole, outside every unit
          ++frozen_members;
          continue;
        }
        const std::size_t k = found->second;
        if (owner[k] == index) continue;
        if (owner[k] != -1) {
          throw std::invalid_argument(fmt::format(
              "ShardedTrainer: parameter '{}' belongs to units '{}' and '{}'; units must not "
              "contain one another or share parameters",
              params[k].first, units_[owner[k]].name, u.name));
        }
        owner[k] = index;
        mine.push_back(k);
      }
      if (mine.empty() && frozen_members == 0) {
        throw std::invalid_argument(fmt::format(
            "ShardedTrainer: unit '{}' has no parameters; leave it out of the units", u.name));
      }
      // A unit whose parameters are all frozen has nothing to gather or reduce: it is not a
      // unit (call() runs its forward as it is), so frozen blocks can stay in the units list.
      if (mine.empty()) continue;
      std::sort(mine.begin(), mine.end());  // registration order inside the unit
      add_sorted(u, std::move(mine));
      units_.push_back(std::move(u));
      declared_order_.push_back(index);
    }
    FlatUnit root;
    root.name = "(root)";
    std::vector<std::size_t> unowned;
    for (std::size_t k = 0; k < params.size(); ++k) {
      if (owner[k] == -1) unowned.push_back(k);
    }
    add_sorted(root, std::move(unowned));
    if (!root.params.empty()) {
      root_unit_ = static_cast<int>(units_.size());
      units_.push_back(std::move(root));
      declared_order_.push_back(root_unit_);
    }
  }

  for (std::size_t i = 0; i < units_.size(); ++i) {
    FlatUnit& u = units_[i];
    u.finalize(shard_count_);
    u.shard_offset = shard_total_numel_;
    shard_total_numel_ += u.shard_numel;
    u.persistent_full = options_.stage < 3 || static_cast<int>(i) == root_unit_;
  }
}

void TrainerCore::initialize() {
  initialize_parameters();
  install_hooks();
  if (options_.stage == 3) {
    for (std::size_t i = 0; i < units_.size(); ++i) {
      if (units_[i].module == nullptr) continue;
      register_unit_module(units_[i].module, shared_from_this(), static_cast<int>(i));
      registered_modules_.push_back(units_[i].module);
    }
  }
  for (const FlatUnit& u : units_) u.check_invariants();
  measure_states();
}

std::vector<ShardSegment> TrainerCore::shard_segments() const {
  auto settings = [&](int group) {
    double lr = options_.adamw.lr;
    double wd = options_.adamw.weight_decay;
    if (group > 0) {
      const ParamGroup& g = options_.param_groups[static_cast<std::size_t>(group - 1)];
      lr = g.lr.value_or(lr);
      wd = g.weight_decay.value_or(wd);
    }
    return std::pair<double, double>(lr, wd);
  };
  std::vector<ShardSegment> out;
  auto append = [&](std::int64_t offset, std::int64_t numel, int group) {
    if (numel <= 0) return;
    const auto [lr, wd] = settings(group);
    if (!out.empty() && out.back().lr == lr && out.back().weight_decay == wd &&
        out.back().offset + out.back().numel == offset) {
      out.back().numel += numel;
    } else {
      out.push_back(ShardSegment{offset, numel, lr, wd});
    }
  };
  for (const FlatUnit& u : units_) {
    // This rank's shard of the unit, [begin, end) of its flat buffer, cut at group changes;
    // padding takes the group of the unit's last parameter (its values stay zero anyway).
    const std::int64_t begin = static_cast<std::int64_t>(shard_index_) * u.shard_numel;
    const std::int64_t end = begin + u.shard_numel;
    std::int64_t pos = begin;
    for (const ParamSlot& s : u.params) {
      const std::int64_t lo = std::max(begin, s.offset);
      const std::int64_t hi = std::min(end, s.offset + s.numel);
      if (lo >= hi) continue;
      append(u.shard_offset + (pos - begin), hi - pos, s.group);  // includes any gap before
      pos = hi;
    }
    if (pos < end) append(u.shard_offset + (pos - begin), end - pos, u.params.back().group);
  }
  return out;
}

at::TensorOptions TrainerCore::compute_options() const {
  return at::TensorOptions().dtype(options_.compute_dtype).device(device_);
}

void TrainerCore::initialize_parameters() {
  at::NoGradGuard no_grad;
  optimizer_ = std::make_unique<AdamWShard>(shard_total_numel_, device_, options_.adamw,
                                            shard_segments());
  // Frozen parameters: rank 0's values everywhere, in compute dtype, outside the flat buffers.
  for (auto& [name, p] : frozen_) {
    if (!p.is_floating_point()) continue;
    at::Tensor value = p.detach().to(at::kFloat).contiguous().clone();
    if (options_.broadcast_initial_params && world_size_ > 1) {
      std::vector<at::Tensor> tensors{value};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      comm_->broadcast(tensors, opts)->wait();
    }
    p.set_data(value.to(options_.compute_dtype));
  }
  if (options_.stage >= 2) grad_shard_ = at::zeros({shard_total_numel_}, compute_options());
  if (options_.stage == 3) param_shard_ = at::zeros({shard_total_numel_}, compute_options());
  const auto fp32 = at::TensorOptions().dtype(at::kFloat).device(device_);
  for (FlatUnit& u : units_) {
    at::Tensor flat = at::zeros({u.padded_numel}, fp32);
    for (const ParamSlot& s : u.params) {
      flat.narrow(0, s.offset, s.numel).copy_(s.param.detach().reshape(-1));
    }
    if (options_.broadcast_initial_params && world_size_ > 1) {
      std::vector<at::Tensor> tensors{flat};
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      comm_->broadcast(tensors, opts)->wait();
    }
    optimizer_->master()
        .narrow(0, u.shard_offset, u.shard_numel)
        .copy_(u.shard_of(flat, shard_index_));
    u.full_params = flat.to(options_.compute_dtype, /*non_blocking=*/false, /*copy=*/true);
    if (options_.stage == 3) {
      param_shard_.narrow(0, u.shard_offset, u.shard_numel)
          .copy_(u.shard_of(u.full_params, shard_index_));
    }
    // The module's parameters become views of the unit's buffer: same TensorImpl (so the
    // module's members and named_parameters() see it), new dtype and storage.
    for (ParamSlot& s : u.params) {
      s.param.set_data(u.full_params.narrow(0, s.offset, s.numel).view(s.shape));
      s.param.mutable_grad().reset();
    }
    if (options_.stage <= 1) {
      u.full_grads = at::zeros({u.padded_numel}, compute_options());
      attach_grad_views(u);
    }
    if (u.persistent_full) {
      u.state = GatherState::kGathered;
    } else {
      free_storage(u.full_params);
      u.state = GatherState::kSharded;
    }
  }
}

void TrainerCore::attach_grad_views(FlatUnit& u) {
  for (ParamSlot& s : u.params) {
    s.param.mutable_grad() = u.full_grads.narrow(0, s.offset, s.numel).view(s.shape);
  }
}

void TrainerCore::install_hooks() {
  for (std::size_t ui = 0; ui < units_.size(); ++ui) {
    for (std::size_t si = 0; si < units_[ui].params.size(); ++si) {
      const ParamSlot& s = units_[ui].params[si];
      torch::autograd::impl::set_post_acc_grad_hooks(
          s.param, std::make_unique<GradReadyHook>(weak_from_this(), static_cast<int>(ui),
                                                   static_cast<int>(si)));
    }
  }
  hooks_installed_ = true;
}

void TrainerCore::detach() noexcept {
  try {
    for (const torch::nn::Module* m : registered_modules_) unregister_unit_module(m, this);
    registered_modules_.clear();
    if (hooks_installed_) {
      for (FlatUnit& u : units_) {
        for (ParamSlot& s : u.params)
          torch::autograd::impl::set_post_acc_grad_hooks(s.param, nullptr);
      }
      hooks_installed_ = false;
    }
  } catch (...) {
    // Detaching must not throw (it runs in destructors); a hook left behind is inert because
    // it holds the core weakly.
  }
}

// ---------------------------------------------------------------------------------------------
// Error handling

void TrainerCore::check_usable(const char* what) const {
  if (!broken_.empty()) {
    throw std::runtime_error(fmt::format(
        "ShardedTrainer::{} on rank {}: the trainer is unusable after an earlier failure: {}", what,
        rank_, broken_));
  }
}

template <class F>
void TrainerCore::guarded(const char* what, F&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    if (broken_.empty()) broken_ = fmt::format("{} failed: {}", what, error_message(e));
    throw;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward and gradient reduction

void TrainerCore::check_requires_grad_unchanged() const {
  for (const FlatUnit& u : units_) {
    for (const ParamSlot& s : u.params) {
      if (!s.param.requires_grad()) {
        throw std::logic_error(fmt::format(
            "ShardedTrainer::backward: parameter '{}' was trainable when the trainer was built "
            "and is frozen now; freeze or unfreeze parameters before constructing the trainer "
            "(build a new one to change which are trained)",
            s.name));
      }
    }
  }
  for (const auto& [name, p] : frozen_) {
    if (p.requires_grad()) {
      throw std::logic_error(fmt::format(
          "ShardedTrainer::backward: parameter '{}' was frozen when the trainer was built and "
          "requires grad now; freeze or unfreeze parameters before constructing the trainer "
          "(build a new one to change which are trained)",
          name));
    }
  }
}

at::Tensor TrainerCore::reduced_gradient_shard() const {
  if (options_.stage >= 2) return grad_shard_.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
  std::vector<at::Tensor> parts;
  parts.reserve(units_.size());
  for (const FlatUnit& u : units_) parts.push_back(u.shard_of(u.full_grads, shard_index_));
  return at::cat(parts).to(at::kFloat);
}

void TrainerCore::fold_reduced_gradients() {
  // A second backward() in one step: keep what the earlier ones reduced in the fp32
  // accumulator and start the compute-dtype gradients from zero again.
  at::NoGradGuard no_grad;
  const at::Tensor reduced = reduced_gradient_shard();
  if (!grad_accum_.defined()) {
    grad_accum_ = reduced;
  } else {
    grad_accum_.add_(reduced);
  }
  if (options_.stage <= 1) {
    for (FlatUnit& u : units_) u.full_grads.zero_();
  } else {
    grad_shard_.zero_();
  }
}

void TrainerCore::backward(const at::Tensor& loss) {
  check_usable("backward");
  if (phase_ == Phase::kInBackward) {
    throw std::logic_error("ShardedTrainer::backward: re-entered from inside backward()");
  }
  if (!loss.defined() || loss.numel() != 1) {
    throw std::invalid_argument("ShardedTrainer::backward: the loss must be a one-element tensor");
  }
  if (!loss.requires_grad()) {
    throw std::invalid_argument(
        "ShardedTrainer::backward: the loss does not require grad (it was computed under no-grad "
        "or without the model's parameters)");
  }
  check_requires_grad_unchanged();
  guarded("backward", [&] {
    if (phase_ == Phase::kReduced) fold_reduced_gradients();  // gradient accumulation
    phase_ = Phase::kInBackward;
    for (FlatUnit& u : units_) {
      if (options_.stage <= 1) {
        attach_grad_views(u);  // the user may have cleared .grad (zero_grad) since the last step
      } else {
        for (ParamSlot& s : u.params) s.param.mutable_grad().reset();
      }
    }
    loss.backward();
    finish_backward();
    ++backwards_this_step_;
    phase_ = Phase::kReduced;
  });
}

void TrainerCore::on_grad_ready(int unit, int slot, const at::Tensor& param) {
  if (phase_ != Phase::kInBackward) {
    const std::string what = fmt::format(
        "gradients arrived outside ShardedTrainer::backward(): call trainer.backward(loss) "
        "instead of loss.backward() (parameter '{}')",
        units_[unit].params[slot].name);
    throw std::logic_error(what);
  }
  guarded("backward", [&] {
    FlatUnit& u = units_[unit];
    ParamSlot& s = u.params[slot];
    TORCH_INTERNAL_ASSERT(!s.grad_ready, "gradient of ", s.name,
                          " accumulated twice in one backward");
    const at::Tensor& grad = param.grad();
    if (options_.stage >= 2) {
      if (!u.grad_staging.defined()) {
        u.grad_staging = at::zeros({u.padded_numel}, compute_options());
        note_transient(static_cast<double>(storage_bytes(u.grad_staging)));
      }
      if (grad.defined()) u.grad_staging.narrow(0, s.offset, s.numel).copy_(grad.reshape(-1));
      param.mutable_grad().reset();  // only the shard is kept
    } else {
      at::Tensor view = u.full_grads.narrow(0, s.offset, s.numel);
      const bool in_place = grad.defined() && grad.data_ptr() == view.data_ptr();
      if (grad.defined() && !in_place) {
        view.copy_(grad.reshape(-1));  // autograd replaced .grad instead of accumulating into it
        param.mutable_grad() = view.view(s.shape);
      }
    }
    s.grad_ready = true;
    --u.pending_grads;
    launch_ready_reductions();
  });
}

void TrainerCore::build_reduce_order() {
  reduce_order_.clear();
  next_reduce_ = 0;
  if (options_.stage < 3) {
    for (std::size_t i = 0; i < units_.size(); ++i) reduce_order_.push_back(static_cast<int>(i));
    return;
  }
  // Stage 3: backward runs units in reverse forward order; units not called this step follow
  // in declared order, the root last. Every rank derives the same order from the same forward.
  std::vector<bool> placed(units_.size(), false);
  for (auto it = current_forward_order_.rbegin(); it != current_forward_order_.rend(); ++it) {
    reduce_order_.push_back(*it);
    placed[*it] = true;
  }
  for (int u : declared_order_) {
    if (!placed[u]) reduce_order_.push_back(u);
  }
}

void TrainerCore::launch_ready_reductions() {
  if (reduce_order_.empty()) build_reduce_order();
  // Strictly in order, so every rank issues the same collectives in the same sequence even if
  // a later unit happens to be ready first.
  while (next_reduce_ < reduce_order_.size() &&
         units_[reduce_order_[next_reduce_]].pending_grads == 0) {
    const int unit = reduce_order_[next_reduce_++];
    launch_reduction(unit);
  }
}

void TrainerCore::launch_reduction(int unit) {
  FlatUnit& u = units_[unit];
  PendingReduction p;
  p.unit = unit;
  if (options_.stage <= 1) {
    std::vector<at::Tensor> tensors{u.full_grads};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::AVG;
    p.input = u.full_grads;
    p.work = comm_->allreduce(tensors, opts);
  } else {
    if (!u.grad_staging.defined()) {  // no parameter of the unit received a gradient
      u.grad_staging = at::zeros({u.padded_numel}, compute_options());
      note_transient(static_cast<double>(storage_bytes(u.grad_staging)));
    }
    p.input = std::move(u.grad_staging);
    u.grad_staging = at::Tensor();
    p.output = at::empty({u.shard_numel}, compute_options());
    note_transient(static_cast<double>(storage_bytes(p.output)));
    c10d::ReduceScatterOptions opts;
    opts.reduceOp = c10d::ReduceOp::AVG;
    p.work = comm_->_reduce_scatter_base(p.output, p.input, opts);
    if (options_.stage == 3) reshard(unit);  // its backward is done
  }
  pending_.push_back(std::move(p));
  while (static_cast<int>(pending_.size()) > options_.max_inflight_reductions) {
    complete_oldest_reduction();
  }
}

void TrainerCore::complete_oldest_reduction() {
  PendingReduction p = std::move(pending_.front());
  pending_.pop_front();
  p.work->wait();
  if (options_.stage >= 2) {
    const FlatUnit& u = units_[p.unit];
    grad_shard_.narrow(0, u.shard_offset, u.shard_numel).add_(p.output);
    note_transient(-static_cast<double>(storage_bytes(p.input) + storage_bytes(p.output)));
  }
}

void TrainerCore::finish_backward() {
  at::NoGradGuard no_grad;
  if (reduce_order_.empty()) build_reduce_order();
  // Parameters that received no gradient (not used by this loss) count as zero gradients.
  for (std::size_t i = next_reduce_; i < reduce_order_.size(); ++i) {
    FlatUnit& u = units_[reduce_order_[i]];
    for (ParamSlot& s : u.params) s.grad_ready = true;
    u.pending_grads = 0;
  }
  launch_ready_reductions();
  while (!pending_.empty()) complete_oldest_reduction();
  if (options_.stage == 3) {
    for (std::size_t i = 0; i < units_.size(); ++i) reshard(static_cast<int>(i));
    if (!current_forward_order_.empty()) forward_order_ = current_forward_order_;
    current_forward_order_.clear();
    in_forward_pass_ = false;
  }
  for (FlatUnit& u : units_) {
    for (ParamSlot& s : u.params) s.grad_ready = false;
    u.pending_grads = static_cast<int>(u.params.size());
    u.check_invariants();
  }
  reduce_order_.clear();
  next_reduce_ = 0;
  measure_states();
}

// ---------------------------------------------------------------------------------------------
// Optimizer step

void TrainerCore::step() {
  check_usable("step");
  if (phase_ != Phase::kReduced) {
    throw std::logic_error(
        "ShardedTrainer::step: no reduced gradients; call trainer.backward(loss) (once, or once "
        "per micro-batch to accumulate), then step()");
  }
  guarded("step", [&] {
    at::NoGradGuard no_grad;
    at::Tensor grad = reduced_gradient_shard();
    if (backwards_this_step_ > 1) {
      // Gradient accumulation: the sum over this step's backward() calls, as .grad holds it
      // after several loss.backward() calls in plain PyTorch.
      grad_accum_.add_(grad);
      grad = grad_accum_;
    }
    if (options_.max_grad_norm > 0) {
      // Global L2 norm over all ranks' shards (disjoint, so their squares add up), then the
      // clip_grad_norm_ rule: scale by max_norm / (norm + 1e-6) when that is below 1.
      at::Tensor sum_sq = grad.pow(2).sum().reshape({1});
      if (shard_count_ > 1) {
        std::vector<at::Tensor> tensors{sum_sq};
        c10d::AllreduceOptions opts;
        opts.reduceOp = c10d::ReduceOp::SUM;
        comm_->allreduce(tensors, opts)->wait();
      }
      const double norm = std::sqrt(sum_sq.item<double>());
      const double coef = options_.max_grad_norm / (norm + 1e-6);
      if (coef < 1.0) grad.mul_(coef);
    }
    optimizer_->update(grad);
    grad = at::Tensor();
    if (grad_accum_.defined()) grad_accum_.zero_();
    backwards_this_step_ = 0;

    // Refresh the compute parameters from the updated master shard.
    std::vector<c10::intrusive_ptr<c10d::Work>> gathers;
    for (std::size_t i = 0; i < units_.size(); ++i) {
      FlatUnit& u = units_[i];
      const at::Tensor master = optimizer_->master().narrow(0, u.shard_offset, u.shard_numel);
      if (options_.stage == 3) {
        at::Tensor shard = param_shard_.narrow(0, u.shard_offset, u.shard_numel);
        shard.copy_(master);
        if (u.persistent_full) {  // the root unit stays gathered
          gathers.push_back(comm_->_allgather_base(u.full_params, shard));
        }
      } else {
        at::Tensor mine = u.shard_of(u.full_params, shard_index_);
        mine.copy_(master);
        if (shard_count_ > 1) gathers.push_back(comm_->_allgather_base(u.full_params, mine));
      }
    }
    for (auto& w : gathers) w->wait();

    if (options_.stage <= 1) {
      for (FlatUnit& u : units_) u.full_grads.zero_();
    } else {
      grad_shard_.zero_();
    }
    phase_ = Phase::kIdle;
    measure_states();
  });
}

std::vector<std::pair<std::string, at::Tensor>> TrainerCore::gather_full_parameters() {
  check_usable("gather_full_parameters");
  std::unordered_map<std::string, at::Tensor> by_name;
  guarded("gather_full_parameters", [&] {
    at::NoGradGuard no_grad;
    for (const FlatUnit& u : units_) {
      at::Tensor mine = optimizer_->master().narrow(0, u.shard_offset, u.shard_numel);
      at::Tensor full;
      if (shard_count_ == 1) {
        full = mine;
      } else {
        full = at::empty({u.padded_numel}, mine.options());
        comm_->_allgather_base(full, mine)->wait();
      }
      for (const ParamSlot& s : u.params) {
        by_name[s.name] = full.narrow(0, s.offset, s.numel).view(s.shape).clone();
      }
    }
    for (const auto& [name, p] : frozen_) {
      by_name[name] = p.is_floating_point() ? p.detach().to(at::kFloat, false, /*copy=*/true)
                                            : p.detach().clone();
    }
  });
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(param_order_.size());
  for (const std::string& name : param_order_) out.emplace_back(name, by_name.at(name));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stage 3: gather, reshard, prefetch

void TrainerCore::start_gather(int unit, bool on_side_stream) {
  FlatUnit& u = units_[unit];
  if (u.state != GatherState::kSharded) return;
  auto launch = [&] {
    allocate_storage(u.full_params, full_bytes(u));
    at::Tensor shard = param_shard_.narrow(0, u.shard_offset, u.shard_numel);
    u.gather_work = comm_->_allgather_base(u.full_params, shard);
  };
  u.gathered_on_side_stream = on_side_stream && streams_.active();
  if (u.gathered_on_side_stream) {
    streams_.run_on_side_stream(launch);
  } else {
    launch();
  }
  u.state = GatherState::kGathering;
  note_transient(static_cast<double>(full_bytes(u)));
}

void TrainerCore::wait_gathered(int unit) {
  FlatUnit& u = units_[unit];
  if (u.state == GatherState::kSharded) start_gather(unit, /*on_side_stream=*/false);
  if (u.state == GatherState::kGathering) {
    u.gather_work->wait();  // on CUDA: the current (compute) stream waits for the all-gather
    u.gather_work.reset();
    if (u.gathered_on_side_stream) streams_.record_on_current_stream(u.full_params);
    u.state = GatherState::kGathered;
  }
}

void TrainerCore::reshard(int unit) {
  FlatUnit& u = units_[unit];
  if (u.persistent_full || u.state == GatherState::kSharded) return;
  if (u.state == GatherState::kGathering) wait_gathered(unit);
  const double bytes = static_cast<double>(full_bytes(u));
  free_storage(u.full_params);
  u.state = GatherState::kSharded;
  note_transient(-bytes);
}

std::optional<int> TrainerCore::next_unit_after(int unit) const {
  const std::vector<int>& order = forward_order_.empty() ? declared_order_ : forward_order_;
  auto it = std::find(order.begin(), order.end(), unit);
  if (it == order.end() || ++it == order.end() || *it == root_unit_) return std::nullopt;
  return *it;
}

std::optional<int> TrainerCore::unit_before_in_this_forward(int unit) const {
  auto it = std::find(current_forward_order_.begin(), current_forward_order_.end(), unit);
  if (it == current_forward_order_.end() || it == current_forward_order_.begin())
    return std::nullopt;
  return *(it - 1);
}

void TrainerCore::before_unit_forward(int unit) {
  check_usable("forward of a stage-3 unit");
  guarded("forward", [&] {
    if (!in_forward_pass_) {
      in_forward_pass_ = true;
      current_forward_order_.clear();
    }
    if (std::find(current_forward_order_.begin(), current_forward_order_.end(), unit) ==
        current_forward_order_.end()) {
      current_forward_order_.push_back(unit);
    }
    wait_gathered(unit);
    if (options_.prefetch) {
      if (auto next = next_unit_after(unit)) start_gather(*next, /*on_side_stream=*/true);
    }
  });
}

void TrainerCore::after_unit_forward(int unit, bool will_run_backward) {
  if (!broken_.empty()) return;
  guarded("forward", [&] {
    if (!will_run_backward || options_.reshard_after_forward) reshard(unit);
  });
}

void TrainerCore::before_unit_backward(int unit) {
  check_usable("backward of a stage-3 unit");
  guarded("backward", [&] {
    wait_gathered(unit);
    if (options_.prefetch) {
      if (auto prev = unit_before_in_this_forward(unit))
        start_gather(*prev, /*on_side_stream=*/true);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// Measurement

void TrainerCore::note_transient(double delta_bytes) {
  transient_bytes_ += delta_bytes;
  transient_peak_bytes_ = std::max(transient_peak_bytes_, transient_bytes_);
}

ModelStateBytes TrainerCore::model_state_bytes() const {
  ModelStateBytes m;
  std::unordered_set<const c10::StorageImpl*> seen;
  auto count = [&](double& field, const at::Tensor& t) {
    if (!t.defined()) return;
    const c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
    if (!seen.insert(s).second) return;
    field += static_cast<double>(s->nbytes());
  };
  count(m.compute_params_bytes, param_shard_);
  for (const FlatUnit& u : units_) count(m.compute_params_bytes, u.full_params);
  count(m.grads_bytes, grad_shard_);
  count(m.grads_bytes, grad_accum_);
  for (const FlatUnit& u : units_) {
    count(m.grads_bytes, u.full_grads);
    count(m.grads_bytes, u.grad_staging);
    for (const ParamSlot& s : u.params) count(m.grads_bytes, s.param.grad());
  }
  if (optimizer_) {
    count(m.master_params_bytes, optimizer_->master());
    count(m.optimizer_state_bytes, optimizer_->exp_avg());
    count(m.optimizer_state_bytes, optimizer_->exp_avg_sq());
  }
  return m;
}

void TrainerCore::measure_states() {
  const ModelStateBytes now = model_state_bytes();
  if (now.total_bytes() > peak_states_.total_bytes()) peak_states_ = now;
}

ModelStateBytes TrainerCore::expected_model_state_bytes() const {
  ModelStateShape shape;
  shape.stage = options_.stage;
  shape.num_params = num_params_;
  shape.world_size = world_size_;
  shape.compute_bytes_per_param = static_cast<int>(c10::elementSize(options_.compute_dtype));
  return gpumem::zero::expected_model_state_bytes(shape);
}

std::string TrainerCore::describe_units() const {
  std::string out;
  for (const FlatUnit& u : units_) {
    out += fmt::format("{:<24} {:>4} params {:>12} elements (padded {:>12}, shard {:>12}){}\n",
                       u.name, u.params.size(), u.numel, u.padded_numel, u.shard_numel,
                       u.persistent_full ? "" : ", sharded between uses");
  }
  if (!options_.param_groups.empty()) {
    std::vector<std::int64_t> counts(options_.param_groups.size() + 1, 0);
    for (const FlatUnit& u : units_) {
      for (const ParamSlot& s : u.params) counts[static_cast<std::size_t>(s.group)] += s.numel;
    }
    out += fmt::format("param group (default): {} elements, lr {}, weight decay {}\n", counts[0],
                       options_.adamw.lr, options_.adamw.weight_decay);
    for (std::size_t i = 0; i < options_.param_groups.size(); ++i) {
      const ParamGroup& g = options_.param_groups[i];
      out += fmt::format("param group '{}': {} elements, lr {}, weight decay {}\n", g.name,
                         counts[i + 1], g.lr.value_or(options_.adamw.lr),
                         g.weight_decay.value_or(options_.adamw.weight_decay));
    }
  }
  for (const auto& [name, p] : frozen_) {
    out += fmt::format("frozen {:<24} {:>12} elements, whole on every rank\n", name, p.numel());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Stage-3 unit registry

namespace {

struct RegistryEntry {
  std::weak_ptr<TrainerCore> core;
  const TrainerCore* owner = nullptr;
  int unit = -1;
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const torch::nn::Module*, RegistryEntry>& registry() {
  static std::unordered_map<const torch::nn::Module*, RegistryEntry> r;
  return r;
}

}  // namespace

void register_unit_module(const torch::nn::Module* module, const std::shared_ptr<TrainerCore>& core,
                          int unit) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto [it, inserted] = registry().try_emplace(module);
  if (!inserted && !it->second.core.expired()) {
    throw std::invalid_argument(fmt::format(
        "ShardedTrainer: module '{}' is already a unit of another live trainer; wrap each model "
        "in one trainer",
        module->name()));
  }
  it->second = RegistryEntry{core, core.get(), unit};
}

void unregister_unit_module(const torch::nn::Module* module, const TrainerCore* core) noexcept {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(module);
  if (it != registry().end() && it->second.owner == core) registry().erase(it);
}

UnitRef find_unit_module(const torch::nn::Module* module) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(module);
  if (it == registry().end()) return {};
  return UnitRef{it->second.core.lock(), it->second.unit};
}

// ---------------------------------------------------------------------------------------------
// gpumem::zero::call's scope

UnitForwardScope::UnitForwardScope(const torch::nn::Module* module) {
  UnitRef ref = find_unit_module(module);
  if (!ref.core) return;
  ref.core->before_unit_forward(ref.unit);
  core_ = std::move(ref.core);
  unit_ = ref.unit;
}

UnitForwardScope::~UnitForwardScope() {
  if (core_ && !finished_) {
    try {
      core_->after_unit_forward(unit_, /*will_run_backward=*/false);
    } catch (...) {
      // Already unwinding from the forward's exception; the trainer records its own failure.
    }
  }
}

void UnitForwardScope::watch_output(const at::Tensor& output) {
  if (!core_ || !output.defined() || !output.requires_grad() || !c10::GradMode::is_enabled())
    return;
  std::weak_ptr<TrainerCore> weak = core_;
  const int unit = unit_;
  output.register_hook([weak, unit](const at::Tensor&) {
    if (auto core = weak.lock()) core->before_unit_backward(unit);
  });
  hooked_ = true;
}

void UnitForwardScope::finish() {
  finished_ = true;
  if (core_) core_->after_unit_forward(unit_, hooked_);
}

}  // namespace gpumem::zero::detail

// -------------------------------------------------------------------------------------------------
// ShardedTrainer: the public face of TrainerCore

namespace gpumem::zero {

ShardedTrainer::ShardedTrainer(std::shared_ptr<torch::nn::Module> model,
                               c10::intrusive_ptr<c10d::Backend> comm,
                               ShardedTrainerOptions options,
                               std::vector<std::shared_ptr<torch::nn::Module>> units)
    : core_(std::make_shared<detail::TrainerCore>(std::move(model), std::move(comm), options,
                                                  std::move(units))) {
  try {
    core_->initialize();
  } catch (...) {
    core_->detach();
    throw;
  }
}

ShardedTrainer::~ShardedTrainer() {
  if (core_) core_->detach();
}

void ShardedTrainer::backward(const at::Tensor& loss) { core_->backward(loss); }
void ShardedTrainer::step() { core_->step(); }
std::vector<std::pair<std::string, at::Tensor>> ShardedTrainer::gather_full_parameters() {
  return core_->gather_full_parameters();
}
ModelStateBytes ShardedTrainer::model_state_bytes() const { return core_->model_state_bytes(); }
ModelStateBytes ShardedTrainer::peak_model_state_bytes() const {
  return core_->peak_model_state_bytes();
}
ModelStateBytes ShardedTrainer::expected_model_state_bytes() const {
  return core_->expected_model_state_bytes();
}
double ShardedTrainer::transient_peak_bytes() const { return core_->transient_peak_bytes(); }
int ShardedTrainer::stage() const { return core_->options().stage; }
int ShardedTrainer::rank() const { return core_->rank(); }
int ShardedTrainer::world_size() const { return core_->world_size(); }
at::Device ShardedTrainer::device() const { return core_->device(); }
c10::ScalarType ShardedTrainer::compute_dtype() const { return core_->options().compute_dtype; }
std::int64_t ShardedTrainer::num_params() const { return core_->num_params(); }
std::int64_t ShardedTrainer::step_count() const { return core_->step_count(); }
int ShardedTrainer::num_units() const { return core_->num_units(); }
std::string ShardedTrainer::describe_units() const { return core_->describe_units(); }

}  // namespace gpumem::zero
