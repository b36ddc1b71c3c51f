// CpuBytesCounter: live CPU bytes and their high-water mark, from the reports LibTorch's CPU
// allocator makes to the thread's PROFILER_STATE debug info when memory profiling is on (what
// the profiler's memory events are built from; here nothing else listens). Install it with
// c10::DebugInfoGuard(c10::DebugInfoKind::PROFILER_STATE, counter); autograd carries it into
// backward. Counts only allocations made while installed, on `device_type`'s devices (the
// CPU unless set; the CUDA caching allocator reports its blocks the same way).
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <atomic>
#include <cstdint>

namespace dscpp::testing {

struct CpuBytesCounter : c10::MemoryReportingInfoBase {
  std::atomic<int64_t> live{0}, peak{0};
  c10::DeviceType device_type = c10::DeviceType::CPU;
  void reportMemoryUsage(void*, int64_t bytes, size_t, size_t, c10::Device device) override {
    if (device.type() != device_type) return;
    const int64_t now = live += bytes;
    int64_t high = peak.load();
    while (now > high && !peak.compare_exchange_weak(high, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

}  // namespace dscpp::testing
