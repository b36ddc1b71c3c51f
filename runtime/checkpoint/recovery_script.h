// The consolidation script every checkpoint folder gets, as DeepSpeed copies its
// zero_to_fp32.py into each: ours (runtime/checkpoint/zero_to_fp32.py, embedded at build
// time), which needs only torch and reads our checkpoints of ZeRO stages 0-3.
#pragma once

#include <string>
#include <string_view>

namespace dscpp::checkpoint {

// The script's text.
std::string_view zero_to_fp32_script();
// Writes <dir>/zero_to_fp32.py (mode 0755) atomically. Throws CheckpointError naming it.
void write_zero_to_fp32_script(const std::string& dir);

}  // namespace dscpp::checkpoint
