#include "gpumem/ckpt/chain_profiler.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <chrono>

namespace gpumem::ckpt {
namespace {

double now_ns() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : (v[m - 1] + v[m]) / 2;
}

void clear_grads(CheckpointedSequentialImpl& chain) {
  for (at::Tensor& p : chain.parameters()) p.mutable_grad() = at::Tensor();
}

at::Tensor checked_loss(const LossFn& loss_fn, const at::Tensor& out) {
  at::Tensor loss = loss_fn(out);
  TORCH_CHECK(loss.defined() && loss.numel() == 1 && loss.requires_grad(),
              "profile_chain: loss_fn must return a one-element tensor that requires grad; it "
              "returned ", loss.defined() ? "a tensor of " + std::to_string(loss.numel()) +
              " elements" + (loss.requires_grad() ? "" : " that does not require grad")
              : std::string("an undefined tensor"));
  return loss;
}

// The backward side of one instrumented step: which module's backward is running, and what
// was allocated and when it started. Gradient hooks call grad_ready(k) when the gradient of the
// chain's k-th boundary tensor (the output of module k - 1) is ready.
struct BackwardTracker {
  BackwardTracker(MemoryProbe& p, std::vector<ModuleProfile>& m)
      : probe(p), modules(m), start_bytes(m.size()), start_ns(m.size()), bwd_ns(m.size(), 0.0),
        opened(m.size(), false),
        outputs(m.size(), c10::weak_intrusive_ptr<c10::StorageImpl>(
                              c10::intrusive_ptr<c10::StorageImpl>())),
        output_freed(m.size(), false) {}

  MemoryProbe& probe;
  std::vector<ModuleProfile>& modules;
  std::vector<std::int64_t> start_bytes;  // allocated when module i's backward started
  std::vector<double> start_ns;
  std::vector<double> bwd_ns;
  std::int64_t after_chain_bytes = 0;     // A[n]
  std::int64_t head_peak_bytes = 0;
  std::int64_t step_peak_bytes = 0;
  std::vector<bool> opened;              // module i's backward was seen to start
  std::vector<c10::weak_intrusive_ptr<c10::StorageImpl>> outputs;  // module outputs, weakly
  std::vector<bool> output_freed;         // module i's output was gone when its backward began
  bool hold = false;                      // keep each incoming gradient to the end of the module
  at::Tensor held;                        // the incoming gradient of the open module, if hold
  std::ptrdiff_t open = -1;               // module whose backward runs; -1: the loss's;
                                          // -2: none (the chain input's gradient was hooked)

  void close_open() {
    probe.synchronize();
    const double t = now_ns();
    const MemoryReading r = probe.read();
    step_peak_bytes = std::max(step_peak_bytes, r.peak_allocated_bytes);
    if (open == -1) {
      head_peak_bytes = r.peak_allocated_bytes - after_chain_bytes;
    } else if (open >= 0) {
      const auto i = static_cast<std::size_t>(open);
      modules[i].bwd_peak_bytes = r.peak_allocated_bytes - start_bytes[i];
      bwd_ns[i] = t - start_ns[i];
    }
  }

  void open_module(std::size_t i) {
    probe.synchronize();
    const MemoryReading r = probe.read();
    start_bytes[i] = r.allocated_bytes;
    start_ns[i] = now_ns();
    probe.reset_peak();
    open = static_cast<std::ptrdiff_t>(i);
    opened[i] = true;
    output_freed[i] = outputs[i].expired();
  }

  void grad_ready(std::size_t k, const at::Tensor& grad) {
    close_open();
    held = hold ? grad : at::Tensor();
    if (k > 0) {
      open_module(k - 1);
    } else {
      open = -2;
    }
  }
};

}  // namespace

ChainProfile profile_chain(CheckpointedSequentialImpl& chain, const at::Tensor& input,
                           const LossFn& loss_fn, MemoryProbe& probe, ProfileOptions options) {
  TORCH_CHECK(chain.size() > 0, "profile_chain: the chain has no modules; add some first");
  TORCH_CHECK(options.instrumented_steps >= 1 && options.timed_steps >= 1 &&
                  options.warmup_steps >= 0,
              "profile_chain: need instrumented_steps >= 1, timed_steps >= 1, warmup_steps >= 0");
  TORCH_CHECK(at::GradMode::is_enabled(), "profile_chain: grad mode is disabled; profile a "
              "training step with grad enabled");
  const std::size_t n = chain.size();

  auto begin_step = [&] {
    if (options.on_step_begin) options.on_step_begin();
  };
  auto plain_step = [&] {
    clear_grads(chain);
    begin_step();
    at::Tensor loss = checked_loss(loss_fn, chain.forward_range(input, 0, n));
    loss.backward();
  };
  for (int s = 0; s < options.warmup_steps; ++s) plain_step();

  ChainProfile profile;
  profile.probe = probe.name();
  profile.modules.resize(n);
  for (std::size_t i = 0; i < n; ++i) profile.modules[i].name = chain.module_name(i);
  std::vector<std::vector<double>> fwd_ns(n), bwd_ns(n);

  // The instrumented steps, then one more in which each module's incoming gradient is held to the
  // end of its backward (bwd_peak_held_bytes: what a checkpointed segment's last module sees).
  for (int s = 0; s <= options.instrumented_steps; ++s) {
    const bool holding = s == options.instrumented_steps;
    clear_grads(chain);
    std::vector<ModuleProfile> m(n);
    BackwardTracker bt(probe, m);
    bt.hold = holding;
    probe.synchronize();
    probe.reset_peak();
    std::vector<std::int64_t> a(n + 1);
    begin_step();
    a[0] = probe.read().allocated_bytes;
    std::int64_t step_peak = a[0];
    {
      at::Tensor x = input;
      for (std::size_t i = 0; i < n; ++i) {
        probe.synchronize();
        probe.reset_peak();
        const double t0 = now_ns();
        at::Tensor y = chain.forward_range(x, i, i + 1);
        probe.synchronize();
        const double t1 = now_ns();
        const MemoryReading r = probe.read();
        step_peak = std::max(step_peak, r.peak_allocated_bytes);
        m[i].fwd_ns = t1 - t0;
        m[i].fwd_peak_bytes = r.peak_allocated_bytes - a[i];
        m[i].output_bytes = y.defined() && y.has_storage()
                                ? static_cast<std::int64_t>(y.storage().nbytes())
                                : 0;
        if (y.defined() && y.has_storage()) bt.outputs[i] = y.storage().getWeakStorageImpl();
        if (y.defined() && y.requires_grad()) {
          y.register_hook([&bt, k = i + 1](const at::Tensor& g) { bt.grad_ready(k, g); });
        }
        x = std::move(y);  // drops module i's input unless autograd saved it
        a[i + 1] = probe.read().allocated_bytes;
        m[i].kept_bytes = a[i + 1] - a[i];
      }
      bt.after_chain_bytes = a[n];
      probe.reset_peak();
      at::Tensor loss = checked_loss(loss_fn, x);
      x = at::Tensor();  // the caller does not hold the chain's output
      loss.backward();
    }
    bt.close_open();  // the last module's backward (or the loss's, if nothing was hooked)
    bt.held = at::Tensor();
    if (holding) {
      for (std::size_t i = 0; i < n; ++i) {
        profile.modules[i].bwd_peak_held_bytes = bt.opened[i] ? m[i].bwd_peak_bytes : 0;
      }
      continue;
    }
    step_peak = std::max(step_peak, bt.step_peak_bytes);
    for (std::size_t i = 0; i < n; ++i) {
      // A module whose backward never started (no gradient reached it) has no backward cost.
      m[i].bwd_extra_bytes = bt.opened[i] ? bt.start_bytes[i] - a[i + 1] : 0;
      m[i].freed_before_bwd_bytes = bt.opened[i] && bt.output_freed[i] ? m[i].output_bytes : 0;
      fwd_ns[i].push_back(m[i].fwd_ns);
      bwd_ns[i].push_back(bt.bwd_ns[i]);
      m[i].name = profile.modules[i].name;
    }
    profile.modules = std::move(m);
    profile.base_bytes = a[0];
    profile.head_peak_bytes = bt.head_peak_bytes;
    profile.measured_peak_bytes = step_peak;
  }
  for (std::size_t i = 0; i < n; ++i) {
    profile.modules[i].fwd_ns = median(fwd_ns[i]);
    profile.modules[i].bwd_ns = median(bwd_ns[i]);
  }

  std::vector<double> step_ns;
  for (int s = 0; s < options.timed_steps; ++s) {
    probe.synchronize();
    const double t0 = now_ns();
    plain_step();
    probe.synchronize();
    step_ns.push_back(now_ns() - t0);
  }
  profile.fwd_bwd_ns = median(step_ns);
  clear_grads(chain);
  return profile;
}

}  // namespace gpumem::ckpt
