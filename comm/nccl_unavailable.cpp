// make_nccl_backend in the CPU build: there is no NCCL to make.
#include "dscpp/comm/backend.h"
#include "dscpp/comm/process_group.h"

namespace dscpp::comm {

std::shared_ptr<BackendHandle> make_nccl_backend(c10::intrusive_ptr<c10d::Store>, int, int,
                                                 std::chrono::milliseconds, int) {
  throw CommError("the NCCL backend is not in this build of dscpp: build with -DDSCPP_CUDA=ON");
}

}  // namespace dscpp::comm
