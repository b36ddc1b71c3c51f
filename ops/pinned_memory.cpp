// host_empty: see pinned_memory.h.
#include "dscpp/ops/pinned_memory.h"

#include <ATen/ATen.h>

#ifdef DSCPP_CUDA
#include "dscpp/ops/cuda_check.h"
#endif

namespace dscpp::ops {

at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pin) {
  const auto options = at::TensorOptions().dtype(dtype).device(at::kCPU);
#ifdef DSCPP_CUDA
  if (pin && numel > 0) {
    void* p = nullptr;
    DSCPP_CUDA_CHECK(cudaHostAlloc(&p, static_cast<size_t>(numel) * c10::elementSize(dtype),
                                   cudaHostAllocDefault));
    // (no check on the way out: at exit the CUDA runtime may be gone before the last storage)
    return at::from_blob(
        p, {numel}, [](void* q) { (void)cudaFreeHost(q); }, options);
  }
#endif
  return at::empty({numel}, options.pinned_memory(pin));
}

}  // namespace dscpp::ops
