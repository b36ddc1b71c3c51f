// A process group whose collectives communicate nothing: each one leaves what this rank's own
// contribution would give if it were the whole result (a reduce-scatter keeps this rank's
// chunk of its input, an all-gather writes its input into its own place, an all-reduce and a
// broadcast leave the tensor as it is). For benchmarks only: a training run handed one (the
// engine's InitArgs::group) keeps every rank's layout, partitions and kernels but skips the
// traffic, so its step time is the bound that overlapping communication is measured against.
// The model does not train correctly with it.
#pragma once

#include <memory>
#include <string>

#include "dscpp/comm/process_group.h"

namespace dscpp::comm {

// rank of size ranks; backend_name: what backend_name() reports (a caller picks the device of
// its tensors by it: "nccl" for CUDA tensors, "gloo" for CPU ones).
std::shared_ptr<ProcessGroup> make_no_op_group(int rank, int size,
                                               const std::string& backend_name = "gloo");
// Shaped like `like` (rank, size, name, backend name), with none of its traffic.
std::shared_ptr<ProcessGroup> make_no_op_group(const ProcessGroup& like);

}  // namespace dscpp::comm
