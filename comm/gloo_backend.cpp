// make_gloo_backend: c10d's ProcessGroupGloo over a TCP device. Kept alone in this file
// because ProcessGroupGloo.hpp (and gloo's headers) are costly to compile.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "dscpp/comm/backend.h"

namespace dscpp::comm {

std::shared_ptr<BackendHandle> make_gloo_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                 int size, std::chrono::milliseconds timeout,
                                                 const std::string& master_addr,
                                                 const std::optional<std::string>& ifname) {
  auto options = c10d::ProcessGroupGloo::Options::create(timeout);
  // GLOO_SOCKET_IFNAME picks the interface as in PyTorch; a job on one machine (loopback
  // master) talks over loopback, whatever this host's name resolves to.
  if (ifname) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(*ifname));
  } else if (master_addr == "localhost" || master_addr.rfind("127.", 0) == 0) {
    options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  auto handle = std::make_shared<BackendHandle>();
  handle->store = store;
  handle->backend = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, options);
  handle->kind = "gloo";
  handle->master_addr = master_addr;
  handle->gloo_ifname = ifname;
  return handle;
}

}  // namespace dscpp::comm
