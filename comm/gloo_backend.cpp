// make_gloo_backend: c10d's ProcessGroupGloo over a TCP device. Kept alone in this file
// because ProcessGroupGloo.hpp (and gloo's headers) are costly to compile.
#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <string>
#include <vector>

#include "dscpp/comm/backend.h"
#include "dscpp/comm/process_group.h"

namespace dscpp::comm {

namespace {

// Gloo connects each pair of a new group from one side: that side counts the pair as up once it
// has written its sequence number, so its rank can leave ProcessGroupGloo's constructor (and
// close the group's sockets, when the caller drops the group at once, as callers of
// new_expert_groups drop the groups they do not use) while the peer still waits to see the
// pair connected. The peer then fails with "Gloo connectFullMesh failed with ... Connection
// closed by peer" (about one 4-rank MoE launch in four under load). So no rank leaves until
// every member has its connections up: each says so in the group's store and waits for the
// others.
void wait_until_all_connected(c10d::Store& store, int rank, int size,
                              std::chrono::milliseconds timeout) {
  const std::string prefix = "dscpp_connected/";
  store.set(prefix + std::to_string(rank), std::vector<uint8_t>{1});
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    throw CommError(fmt::format(
        "a new Gloo group of {} ranks: rank {} waited {} ms for the other members to finish "
        "connecting: {}",
        size, rank, timeout.count(), e.what()));
  }
}

}  // namespace

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
  if (size > 1) wait_until_all_connected(*store, rank, size, timeout);
  handle->kind = "gloo";
  handle->master_addr = master_addr;
  handle->gloo_ifname = ifname;
  return handle;
}

}  // namespace dscpp::comm
