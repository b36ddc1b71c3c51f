// What train_gpt records of a step beside its log: LibTorch's Kineto profile (the Chrome trace
// of --profile-step), the CUDA caching allocator's history (--memory-snapshot), and the device
// waits that make a profile or a timing hold exactly its steps.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace dscpp::examples {

// Waits for the device's queued work (a no-op off CUDA).
void device_sync(at::Device device);

// One step under LibTorch's Kineto profiler (the C++ side of torch.profiler): start() before
// the step, stop() after it saves the Chrome trace. Kineto is compiled into the pip LibTorch
// (torch.autograd.kineto_available()), with CUPTI for the CUDA kernels. Autograd's worker
// threads inherit the profiler through the thread-local state of backward, so backward's ops
// are recorded too.
class StepProfiler {
 public:
  StepProfiler(at::Device device, std::string path) : device_(device), path_(std::move(path)) {}
  void start();
  void stop();

 private:
  at::Device device_;
  std::string path_;
};

// The CUDA caching allocator's history with C++ stacks (torch.cuda.memory._record_memory_history
// from C++); a no-op off CUDA.
void memory_history(at::Device device, bool on);
// The pickle torch.cuda.memory._dump_snapshot would write; a std::runtime_error off CUDA builds.
void write_memory_snapshot(const std::string& path);

// PATH for rank 0 alone; PATH with "-rank<R>" before its extension when every rank writes.
std::string profile_path(const std::string& path, int rank, bool all_ranks);

}  // namespace dscpp::examples
