// libgpumem_pinned_torch.so, loaded on demand (pinned_loader.h).
#include "pinned_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>

namespace gpumem::torch::detail {
namespace {

constexpr const char* kLibraryName = "libgpumem_pinned_torch.so";
constexpr const char* kEntryPoint = "gpumem_install_pinned_with";
// PyTorch's pinned_use_background_threads thread polls its events in a loop; gpumem's polls this often.
constexpr unsigned kBackgroundPeriodUs = 100;

// Where libgpumem_torch.so (the library holding this function) was loaded from, with the slash.
std::string this_library_dir() {
  Dl_info self{};
  if (dladdr(reinterpret_cast<void*>(&this_library_dir), &self) == 0 || self.dli_fname == nullptr) return {};
  const std::string here = self.dli_fname;
  const auto slash = here.rfind('/');
  return slash == std::string::npos ? std::string() : here.substr(0, slash + 1);
}

// What to do about a dlopen error that says the library needs static TLS (Debian's jemalloc).
constexpr const char* kStaticTlsFix =
    "this build's jemalloc uses initial-exec TLS, which a library loaded after start-up only gets when the "
    "process starts with GLIBC_TUNABLES=glibc.rtld.optional_static_tls=16384; or rebuild with "
    "scripts/stage_jemalloc.sh's jemalloc (GPUMEM_JEMALLOC_ROOT), which needs none";

bool needs_static_tls(const std::string& dlopen_error) { return dlopen_error.find("static TLS") != std::string::npos; }

}  // namespace

PinnedLibrary PinnedLibrary::open() {
  PinnedLibrary lib;
  const char* chosen = std::getenv("GPUMEM_PINNED_LIBRARY");
  const bool from_env = chosen != nullptr && *chosen != '\0';
  lib.path_ = from_env ? std::string(chosen) : this_library_dir() + kLibraryName;
  void* handle = dlopen(lib.path_.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr && !from_env) {
    // Not beside this library (an installed layout, a copy): the loader's search path.
    const std::string first = dlerror();
    handle = dlopen(kLibraryName, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      lib.error_ = "pinned_allocator:gpumem, but " + lib.path_ + " cannot be loaded (" + first + "). " +
                   (needs_static_tls(first)
                        ? std::string(kStaticTlsFix)
                        : std::string("Build it (target gpumem_pinned_torch: a CUDA libtorch and jemalloc, see "
                                      "pinned/README.md) or point GPUMEM_PINNED_LIBRARY at it")) +
                   "; pinned_allocator:native keeps PyTorch's";
      return lib;
    }
    lib.path_ = kLibraryName;
  }
  if (handle == nullptr) {
    const std::string why = dlerror();
    std::string fix = "check GPUMEM_PINNED_LIBRARY, or unset it to use the one beside libgpumem_torch.so";
    if (needs_static_tls(why)) fix = kStaticTlsFix;
    lib.error_ = "pinned_allocator:gpumem, but " + lib.path_ + " cannot be loaded (" + why + "); " + fix;
    return lib;
  }
  lib.install_ = reinterpret_cast<InstallFn>(dlsym(handle, kEntryPoint));
  if (lib.install_ == nullptr)
    lib.error_ = "pinned_allocator:gpumem, but " + lib.path_ + " has no " + kEntryPoint +
                 "; it is not gpumem's pinned library (or is older than this libgpumem_torch.so)";
  return lib;
}

std::string PinnedLibrary::install(const AdapterConfig& adapter, const forensics::Config& forensics) const {
  if (install_ == nullptr) return error_;
  char error[1024] = {};
  GpumemPinnedSettings settings{};
  settings.size_bytes = sizeof settings;
  settings.background_period_us = adapter.pinned_use_background_threads ? kBackgroundPeriodUs : 0u;
  settings.touch_threads = adapter.pinned_num_register_threads;
  settings.trace_entries = forensics.trace_entries;
  if (install_(&settings, error, sizeof error) != 0)
    return std::string("pinned_allocator:gpumem: ") + error;
  return {};
}

}  // namespace gpumem::torch::detail
