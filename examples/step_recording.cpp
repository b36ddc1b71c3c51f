// What train_gpt records of a step (step_recording.h).
#include "step_recording.h"

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <stdexcept>
#ifdef DSCPP_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/cuda/memory_snapshot.h>
#endif

namespace dscpp::examples {

void device_sync(at::Device device) {
#ifdef DSCPP_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

void StepProfiler::start() {
  namespace impl = torch::profiler::impl;
  std::set<impl::ActivityType> activities{impl::ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(impl::ActivityType::CUDA);
  const impl::ProfilerConfig config(impl::ProfilerState::KINETO, /*report_input_shapes=*/true,
                                    /*profile_memory=*/false);
  torch::autograd::profiler::prepareProfiler(config, activities);
  device_sync(device_);
  torch::autograd::profiler::enableProfiler(config, activities);
}

void StepProfiler::stop() {
  device_sync(device_);  // the step's last kernels must have run before CUPTI is flushed
  auto result = torch::autograd::profiler::disableProfiler();
  result->save(path_);
}

void memory_history(at::Device device, bool on) {
#ifdef DSCPP_CUDA
  if (!device.is_cuda()) return;
  if (on)
    torch::cuda::_record_memory_history(std::optional<std::string>("all"),
                                        std::optional<std::string>("all"), "all", 1000000);
  else
    torch::cuda::_record_memory_history(std::optional<std::string>(std::nullopt));
#else
  (void)device;
  (void)on;
#endif
}

void write_memory_snapshot(const std::string& path) {
#ifdef DSCPP_CUDA
  std::ofstream(path, std::ios::binary) << torch::cuda::_memory_snapshot_pickled();
#else
  throw std::runtime_error("--memory-snapshot " + path + ": needs the CUDA build");
#endif
}

std::string profile_path(const std::string& path, int rank, bool all_ranks) {
  if (!all_ranks) return path;
  const std::filesystem::path p(path);
  const std::string name =
      p.stem().string() + fmt::format("-rank{}", rank) + p.extension().string();
  return (p.parent_path() / name).string();
}

}  // namespace dscpp::examples
