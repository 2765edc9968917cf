#include "flat_unit.h"

#include <fmt/format.h>

#include <stdexcept>

namespace gpumem::zero::detail {

void FlatUnit::add(const at::Tensor& param, std::string param_name, int group) {
  ParamSlot slot;
  slot.group = group;
  slot.param = param;
  slot.name = std::move(param_name);
  slot.shape = param.sizes().vec();
  slot.offset = numel;
  slot.numel = param.numel();
  numel += slot.numel;
  params.push_back(std::move(slot));
  pending_grads = static_cast<int>(params.size());
}

void FlatUnit::finalize(int count) {
  shard_count = count;
  const std::int64_t k = count;
  padded_numel = (numel + k - 1) / k * k;
  if (padded_numel == 0) padded_numel = k;  // keep every shard non-empty
  shard_numel = padded_numel / k;
}

at::Tensor FlatUnit::shard_of(const at::Tensor& flat, int k) const {
  return flat.narrow(0, static_cast<std::int64_t>(k) * shard_numel, shard_numel);
}

void FlatUnit::check_invariants() const {
  std::int64_t next = 0;
  int not_ready = 0;
  for (const ParamSlot& p : params) {
    TORCH_INTERNAL_ASSERT(p.offset == next, "unit ", name, ": parameter ", p.name, " misplaced");
    next += p.numel;
    if (!p.grad_ready) ++not_ready;
  }
  TORCH_INTERNAL_ASSERT(next == numel, "unit ", name, ": sizes do not add up");
  TORCH_INTERNAL_ASSERT(shard_numel > 0 && padded_numel == shard_numel * shard_count &&
                            numel <= padded_numel &&
                            (numel == 0 || padded_numel - numel < shard_count),
                        "unit ", name, ": bad padding");
  TORCH_INTERNAL_ASSERT(not_ready == pending_grads, "unit ", name, ": pending gradient count ",
                        pending_grads, " but ", not_ready, " parameters are not ready");
  if (full_params.defined()) {
    const std::size_t want = static_cast<std::size_t>(padded_numel) * full_params.itemsize();
    const std::size_t have = storage_bytes(full_params);
    TORCH_INTERNAL_ASSERT(state == GatherState::kSharded ? have == 0 : have == want, "unit ", name,
                          ": storage holds ", have, " bytes in the wrong gather state");
  }
}

void allocate_storage(const at::Tensor& t, std::size_t nbytes) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  TORCH_INTERNAL_ASSERT(s->nbytes() == 0, "allocate_storage on a storage that holds memory");
  c10::Allocator* allocator = s->allocator();
  TORCH_INTERNAL_ASSERT(allocator != nullptr, "storage without an allocator");
  s->set_data_ptr_noswap(allocator->allocate(nbytes));
  s->set_nbytes(nbytes);
}

void free_storage(const at::Tensor& t) {
  c10::StorageImpl* s = t.storage().unsafeGetStorageImpl();
  s->set_data_ptr_noswap(c10::DataPtr(nullptr, s->device()));
  s->set_nbytes(0);
}

std::size_t storage_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  return t.storage().nbytes();
}

}  // namespace gpumem::zero::detail
