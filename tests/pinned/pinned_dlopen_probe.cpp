// pinned_dlopen_probe MODULE: dlopens a shared library that carries gpumem::pinned (as Python does
// with an extension), runs it, and checks that the process's malloc is still the one it had.
// Prints one line; exit 0 = loaded and ran, 3 = dlopen failed (the line quotes dlerror()), 1 = a
// check failed. test_pinned runs it with and without GLIBC_TUNABLES.
#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: pinned_dlopen_probe MODULE.so\n");
    return 2;
  }
  void* const malloc_before = dlsym(RTLD_DEFAULT, "malloc");
  void* handle = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::printf("dlopen failed: %s\n", dlerror());
    return 3;
  }
  auto probe = reinterpret_cast<int (*)()>(dlsym(handle, "gpumem_pinned_probe"));
  if (probe == nullptr || probe() != 0) {
    std::printf("probe failed\n");
    return 1;
  }
  // dlsym on the handle searches the module first: had it defined malloc, this would find it.
  void* const malloc_module = dlsym(handle, "malloc");
  Dl_info where{};
  dladdr(malloc_module, &where);
  if (dlsym(RTLD_DEFAULT, "malloc") != malloc_before || malloc_module != malloc_before) {
    std::printf("malloc changed: the module's malloc is in %s\n", where.dli_fname ? where.dli_fname : "?");
    return 1;
  }
  for (const char* name : {"mallocx", "mallctl", "gpumem_je_mallocx", "gpumem_je_malloc", "je_malloc"}) {
    if (dlsym(handle, name) != nullptr) {
      std::printf("the module exports %s\n", name);
      return 1;
    }
  }
  std::printf("ok: loaded, ran, malloc from %s\n", where.dli_fname ? where.dli_fname : "?");
  return 0;
}
