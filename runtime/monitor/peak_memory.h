// The peak memory the monitors and training logs report: on a CUDA device the caching
// allocator's peak of allocated bytes (torch.cuda.max_memory_allocated), on the host the
// process's resident high-water mark (VmHWM of /proc/self/status). 0 where neither can be read.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>

namespace dscpp::monitor {

int64_t peak_memory_bytes(const c10::Device& device);

}  // namespace dscpp::monitor
