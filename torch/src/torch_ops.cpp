// What Python reaches after torch.ops.load_library(path): the torch.ops.gpumem operators, and the
// installation on library load when GPUMEM_ALLOC_CONF is set.
//
//   torch.ops.gpumem.install(config)          # "" = from the environment; errors raise RuntimeError
//   torch.ops.gpumem.installed() -> bool
//   torch.ops.gpumem.load_error() -> str      # why the load-time installation failed ("" = it did not)
//   torch.ops.gpumem.install_cpu(config)
//   torch.ops.gpumem.memory_stats(device) -> dict[str, int]   # torch.cuda.memory_stats's keys
//   torch.ops.gpumem.reset_peak_stats(device)
//   torch.ops.gpumem.check_config(config) -> str   # the parser's error for a bad string, "" if valid
//   torch.ops.gpumem.cpu_installed() -> bool
//   torch.ops.gpumem.write_snapshot(device, path)  # gpumem/torch/memory_stats.h's write_snapshot
//   torch.ops.gpumem.record_ops(enabled) -> bool   # op attribution on/off at run time; was it on
//
// The Python package (python/gpumem) is built on these.
//
// memory_stats works under every install path, CUDAPluggableAllocator included (where
// torch.cuda.memory_stats raises), and for the CPU engine (device "cpu").
#include <torch/library.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <variant>

#include "gpumem/forensics/op_attribution_torch.h"
#include "gpumem/torch/config.h"
#include "gpumem/torch/install.h"
#include "gpumem/torch/memory_stats.h"
#include "python_error.h"

namespace gpumem::torch {
namespace {

std::string& load_error_text() {
  static auto* text = new std::string();
  return *text;
}

Config parse_or_throw(const std::string& text) {
  auto parsed = parse_config(text);
  if (auto* error = std::get_if<ConfigError>(&parsed)) TORCH_CHECK(false, error->message);
  return std::get<Config>(std::move(parsed));
}

void op_install(std::string config) {
  if (config.empty()) {
    install_from_environment();
  } else {
    install(parse_or_throw(config));
  }
}

bool op_installed() { return installed(); }

std::string op_load_error() { return load_error_text(); }

void op_install_cpu(std::string config) { install_cpu(config.empty() ? Config{} : parse_or_throw(config)); }

c10::Dict<std::string, int64_t> op_memory_stats(c10::Device device) {
  c10::Dict<std::string, int64_t> out;
  for (const auto& [key, value] : memory_stats(device)) out.insert(key, value);
  return out;
}

void op_reset_peak_stats(c10::Device device) { reset_peak_stats(device); }

std::string op_check_config(std::string config) {
  auto parsed = parse_config(config);
  if (auto* error = std::get_if<ConfigError>(&parsed)) return error->message;
  return {};
}

bool op_cpu_installed() { return cpu_installed(); }

void op_write_snapshot(c10::Device device, std::string path) { write_snapshot(device, path); }

// record_ops' run-time switch: the at::RecordFunction callbacks that name each event's op.
bool op_record_ops(bool enabled) { return forensics::set_record_function_attribution(enabled); }

// A training step starts (step_plan:True): the device's planner then takes its steps from these
// marks. Nothing without gpumem on the device or without step_plan.
void op_mark_step(c10::Device device) {
  if (alloc::CachingAllocator* e = engine(device)) e->mark_step();
}

// Installs at load time when GPUMEM_ALLOC_CONF is set. A failure cannot be thrown out of dlopen:
// loaded from Python, it raises RuntimeError there as the load returns (python_error.h); loaded
// from C++, it is printed on stderr. Either way it is kept for torch.ops.gpumem.load_error().
const bool g_installed_on_load = [] {
  if (std::getenv("GPUMEM_ALLOC_CONF") == nullptr) return false;
  try {
    install_from_environment();
    return true;
  } catch (const c10::Error& e) {
    load_error_text() = e.what_without_backtrace();
  } catch (const std::exception& e) {
    load_error_text() = e.what();
  }
  const std::string message = "gpumem: GPUMEM_ALLOC_CONF is set but gpumem was not installed when "
                              "libgpumem_torch.so was loaded; PyTorch's own CUDA allocator stays in use. " +
                              load_error_text();
  if (!detail::raise_in_python(message)) std::fprintf(stderr, "%s\n", message.c_str());
  return false;
}();

}  // namespace
}  // namespace gpumem::torch

TORCH_LIBRARY(gpumem, m) {
  m.def("install(str config) -> ()", &gpumem::torch::op_install);
  m.def("installed() -> bool", &gpumem::torch::op_installed);
  m.def("load_error() -> str", &gpumem::torch::op_load_error);
  m.def("install_cpu(str config) -> ()", &gpumem::torch::op_install_cpu);
  m.def("memory_stats(Device device) -> Dict(str, int)", &gpumem::torch::op_memory_stats);
  m.def("reset_peak_stats(Device device) -> ()", &gpumem::torch::op_reset_peak_stats);
  m.def("check_config(str config) -> str", &gpumem::torch::op_check_config);
  m.def("cpu_installed() -> bool", &gpumem::torch::op_cpu_installed);
  m.def("write_snapshot(Device device, str path) -> ()", &gpumem::torch::op_write_snapshot);
  m.def("record_ops(bool enabled) -> bool", &gpumem::torch::op_record_ops);
  m.def("mark_step(Device device) -> ()", &gpumem::torch::op_mark_step);
}
