// Page-locked host buffers of exactly the size asked for. LibTorch's pinned allocator
// (TensorOptions::pinned_memory) rounds every block up to a power of two, to reuse blocks: an
// offloaded gradient partition of 18.2 GB (9.08 B parameters in bf16) took 34.4 GB of locked
// host memory. ZeRO-Offload's large buffers, sized once and held for the run, come from here.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dscpp::ops {

// An uninitialised 1-D host tensor of `numel` elements of `dtype`: page-locked with CUDA's
// cudaHostAlloc, freed with its storage, when `pin` and this build has CUDA; else as
// at::empty with pinned_memory(pin) makes it.
at::Tensor host_empty(int64_t numel, at::ScalarType dtype, bool pin);

}  // namespace dscpp::ops
