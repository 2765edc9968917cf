#include "ipc_imports.h"

namespace gpumem::torch::detail {

std::variant<std::shared_ptr<void>, std::string> IpcImports::get(const std::string& handle, int device) {
  std::lock_guard lock(mutex_);
  Key key{device, handle};
  std::unique_ptr<ImportedMemory> memory;
  if (auto it = entries_.find(key); it != entries_.end()) {
    if (std::shared_ptr<void> alive = it->second->users.lock()) return alive;
    // The last user is being released right now (its deleter waits for this lock): take the
    // import over; that release will find the entry gone and its memory moved out.
    memory = std::move(it->second->memory);
    entries_.erase(it);
  }
  if (memory == nullptr) {
    auto opened = opener_(handle, device);
    if (auto* why = std::get_if<std::string>(&opened)) return std::move(*why);
    memory = std::move(std::get<std::unique_ptr<ImportedMemory>>(opened));
  }
  auto entry = std::make_shared<Entry>();
  entry->memory = std::move(memory);
  void* base = entry->memory->base();
  std::shared_ptr<void> users(base, [self = shared_from_this(), key, entry](void*) { self->release(key, entry); });
  entry->users = users;
  entries_.emplace(std::move(key), entry);
  return users;
}

void IpcImports::release(const Key& key, const std::shared_ptr<Entry>& entry) {
  std::lock_guard lock(mutex_);
  if (auto it = entries_.find(key); it != entries_.end() && it->second == entry) entries_.erase(it);
  entry->memory.reset();  // unmaps (nothing if a get() took it over)
  entry->users.reset();   // the entry no longer refers to the control block that owns this deleter
}

std::size_t IpcImports::live_imports() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace gpumem::torch::detail
