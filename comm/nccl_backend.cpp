// make_nccl_backend: c10d's ProcessGroupNCCL, bound to one device. Its collectives run on
// NCCL's own streams, ordered after the caller's stream by CUDA events; Work::wait() makes
// the caller's stream wait in turn, so the host never synchronises. Its watchdog turns a
// collective past the timeout into an error instead of a hang.
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "dscpp/comm/backend.h"

namespace dscpp::comm {

std::shared_ptr<BackendHandle> make_nccl_backend(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                 int size, std::chrono::milliseconds timeout,
                                                 int device_index) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  auto handle = std::make_shared<BackendHandle>();
  handle->store = store;
  auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
  // Bound to one device and connected now: a rank that cannot reach its peers fails here,
  // not inside the first collective of training.
  at::Device device(at::kCUDA, static_cast<c10::DeviceIndex>(device_index));
  pg->setBoundDeviceId(device);
  pg->eagerConnectSingleDevice(device);
  handle->backend = pg;
  handle->kind = "nccl";
  handle->native_avg = true;
  handle->device_index = device_index;
  return handle;
}

}  // namespace dscpp::comm
