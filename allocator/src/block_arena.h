// BlockArena: an object pool for Block. Blocks are carved from chunks of 256 and recycled through a
// free list, so splitting a block never calls the heap. Not thread-safe: used under the engine's
// lock.
#pragma once

#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "block.h"

namespace gpumem::alloc::detail {

class BlockArena {
 public:
  BlockArena() = default;
  BlockArena(const BlockArena&) = delete;
  BlockArena& operator=(const BlockArena&) = delete;
  ~BlockArena() {
    for (auto& chunk : chunks_) ::operator delete(chunk, std::align_val_t{alignof(Block)});
  }

  Block* make() {
    if (free_ == nullptr) grow();
    Slot* s = free_;
    free_ = s->next_free;
    ++live_;
    // Default-initialized, not value-initialized (`Block()`): every member has its initializer
    // or constructor, and value-initialization would first zero the whole object (a `rep stos`
    // of 144 bytes on every split) before writing the same values again. The tree hook alone has
    // no initializer (Boost's normal_link hooks leave their links as they are, and assigning one
    // copies nothing), so its bytes are zeroed here, as value-initialization left them.
    Block* b = new (s) Block;
    std::memset(static_cast<void*>(&b->set_hook), 0, sizeof(b->set_hook));
    return b;
  }

  void dispose(Block* b) noexcept {
    b->~Block();
    Slot* s = reinterpret_cast<Slot*>(b);
    s->next_free = free_;
    free_ = s;
    --live_;
  }

  std::size_t live() const noexcept { return live_; }

 private:
  union Slot {
    Slot* next_free;
    alignas(Block) unsigned char storage[sizeof(Block)];
  };
  static constexpr std::size_t kChunk = 256;

  void grow() {
    void* raw = ::operator new(sizeof(Slot) * kChunk, std::align_val_t{alignof(Block)});
    chunks_.push_back(raw);
    Slot* slots = static_cast<Slot*>(raw);
    for (std::size_t i = 0; i < kChunk; ++i) {
      slots[i].next_free = free_;
      free_ = &slots[i];
    }
  }

  std::vector<void*> chunks_;
  Slot* free_ = nullptr;
  std::size_t live_ = 0;
};

}  // namespace gpumem::alloc::detail
