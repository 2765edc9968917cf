// raise_in_python: makes an error that happens while Python loads libgpumem_torch.so (the load-time
// installation, torch_ops.cpp) raise RuntimeError in Python, instead of one line on stderr that a
// long job scrolls past while it runs on PyTorch's allocator. An exception cannot leave dlopen, so
// the error is queued with Py_AddPendingCall: the interpreter raises it in its main thread as soon
// as the load returns (in practice, from the torch.ops.load_library / ctypes.CDLL call itself).
// Python's functions are found with dlsym, so the library does not link against libpython and a
// C++ program that loads it is unaffected (raise_in_python returns false there).
//
// Thread-safety: may be called from any thread, with or without the GIL (Py_AddPendingCall's
// contract); the message is copied.
#pragma once

#include <dlfcn.h>

#include <string>

namespace gpumem::torch::detail {

inline std::string& python_error_message() {
  static auto* text = new std::string();  // lives until the process ends: the call may come late
  return *text;
}

// Runs in Python's main thread, GIL held: sets RuntimeError and fails, which raises it.
inline int raise_pending_python_error(void*) {
  using SetString = void (*)(void*, const char*);
  auto set_string = reinterpret_cast<SetString>(dlsym(RTLD_DEFAULT, "PyErr_SetString"));
  auto* runtime_error = static_cast<void**>(dlsym(RTLD_DEFAULT, "PyExc_RuntimeError"));
  if (!set_string || !runtime_error) return 0;
  set_string(*runtime_error, python_error_message().c_str());
  return -1;
}

// True when the process runs a Python interpreter and the error was queued to be raised there.
inline bool raise_in_python(const std::string& message) {
  using IsInitialized = int (*)();
  using AddPendingCall = int (*)(int (*)(void*), void*);
  auto is_initialized = reinterpret_cast<IsInitialized>(dlsym(RTLD_DEFAULT, "Py_IsInitialized"));
  auto add_pending_call = reinterpret_cast<AddPendingCall>(dlsym(RTLD_DEFAULT, "Py_AddPendingCall"));
  if (!is_initialized || !add_pending_call || !is_initialized()) return false;
  python_error_message() = message;
  return add_pending_call(&raise_pending_python_error, nullptr) == 0;
}

}  // namespace gpumem::torch::detail
