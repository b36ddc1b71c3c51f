// What the local machine offers: NVIDIA GPUs (counted from the driver's /proc and /dev
// entries, so the launcher needs neither CUDA nor a GPU to run) and CPU cores for
// --bind_cores_to_rank.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace dscpp::launcher {

// Physical NVIDIA devices, ignoring CUDA_VISIBLE_DEVICES (DeepSpeed counts them after
// unsetting it too). 0 on a machine without the NVIDIA driver.
int count_nvidia_gpus();

// Number of online logical CPUs.
int online_cpu_count();

// One logical CPU per physical core, among the CPUs this process may run on, ascending.
// This is DeepSpeed's default core list (range(physical cores)) made safe for cpusets.
std::vector<int> physical_core_list();

// Parses a comma separated list of non-negative integers ("0,2,3"); nullopt if any entry is
// not one (UUID or MIG device names).
std::optional<std::vector<int>> parse_device_ids(const std::string& text);

}  // namespace dscpp::launcher
