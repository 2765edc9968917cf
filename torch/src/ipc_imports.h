// IpcImports: the consumer side of CUDA IPC (getIpcDevPtr): one import per handle, shared.
//
// torch.multiprocessing calls getIpcDevPtr(handle) once per storage it receives; storages that
// live in one allocation (or on the same pieces) of the sender arrive with byte-equal handles and
// different offsets. A cudaIpcMemHandle may be opened only once per process, and importing the
// same pieces twice would map them twice, so imports are cached by handle: get() returns the live
// import's pointer if there is one, else opens a new one. The returned shared_ptr<void> points at
// the import's base; when the last copy goes, its deleter removes the entry and destroys the
// import (unmapping and releasing it), as PyTorch's MemHandleCacheEntry does.
//
// A get() that races with the last release of the same handle takes the import over instead of
// opening it a second time (the release then finds nothing left to destroy).
//
// Thread-safety: get() and live_imports() are safe to call concurrently; the deleters of the
// returned pointers may run on any thread. Imports are destroyed with the cache's mutex held.
#pragma once

#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <variant>

namespace gpumem::torch::detail {

// What an opener maps: memory of another process, unmapped by the destructor.
class ImportedMemory {
 public:
  virtual ~ImportedMemory() = default;
  virtual void* base() const noexcept = 0;
};

// Opens the handle's memory on device, or returns one sentence why not.
using IpcOpener =
    std::function<std::variant<std::unique_ptr<ImportedMemory>, std::string>(const std::string& handle, int device)>;

class IpcImports : public std::enable_shared_from_this<IpcImports> {
 public:
  // Make it with std::make_shared (the deleters of the pointers it hands out keep it alive).
  explicit IpcImports(IpcOpener opener) : opener_(std::move(opener)) {}

  std::variant<std::shared_ptr<void>, std::string> get(const std::string& handle, int device);

  // Imports alive now.
  std::size_t live_imports() const;

 private:
  struct Entry {
    std::unique_ptr<ImportedMemory> memory;
    std::weak_ptr<void> users;
  };
  using Key = std::pair<int, std::string>;
  void release(const Key& key, const std::shared_ptr<Entry>& entry);

  IpcOpener opener_;
  mutable std::mutex mutex_;
  std::map<Key, std::shared_ptr<Entry>> entries_;
};

}  // namespace gpumem::torch::detail
