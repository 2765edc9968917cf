// Creates ProcessGroupGloo. Compiled only when Gloo's headers were found at configure time
// (GPUMEM_ZERO_HAVE_GLOO): the torch wheel carries Gloo itself inside libtorch_cpu but not the
// headers ProcessGroupGloo.hpp includes, so those come from the system (Debian's libgloo-dev).
// Kept in its own translation unit: it alone sees Gloo's headers.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace gpumem::zero::detail {

// `master_addr` chooses the transport's address: a loopback MASTER_ADDR binds every rank to
// 127.0.0.1; otherwise GLOO_SOCKET_IFNAME's interface, or this host's resolved name.
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int world_size,
                                                    const std::string& master_addr,
                                                    std::chrono::milliseconds timeout);

}  // namespace gpumem::zero::detail
