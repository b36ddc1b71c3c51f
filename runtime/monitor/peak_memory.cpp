// peak_memory_bytes: the allocator's peak on a GPU, VmHWM on the host.
#include "dscpp/runtime/monitor/peak_memory.h"

#include <fstream>
#include <string>

#ifdef DSCPP_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace dscpp::monitor {

int64_t peak_memory_bytes(const c10::Device& device) {
#ifdef DSCPP_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
        .peak;
  }
#endif
  (void)device;
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // kB
  return 0;
}

}  // namespace dscpp::monitor
