// DeepSpeed's zero_to_fp32 (get_fp32_state_dict_from_zero_checkpoint) for checkpoints of
// stages 0-2, written by dscpp or by DeepSpeed: the full fp32 weights, consolidated from every
// rank's partition, under the module's state_dict names (shared parameters under each of
// their names, buffers as float). A pipeline checkpoint (pipe_checkpoint.h) gives the whole
// model's, from every stage's layer files and partitions. A tensor-parallel checkpoint (the
// plain engine's mp_rank_XX files, or a 3D pipeline's) gives the one-rank model's: each split
// tensor merged over its tensor ranks by the partition metadata (tp_reshape.h). Reads only
// files; no process group, no model needed.
#pragma once

#include <string>

#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint {

// tag "": the one <dir>/latest names. Returns an OrderedDict name -> fp32 CPU tensor.
// Throws CheckpointError naming the file on anything missing or inconsistent.
PyValue get_fp32_state_dict_from_zero_checkpoint(const std::string& dir,
                                                 const std::string& tag = "");

}  // namespace dscpp::checkpoint
