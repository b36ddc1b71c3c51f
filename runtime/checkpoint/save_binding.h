// What binds the files of one saved tag to each other. DeepSpeed's files say nothing of which
// save wrote them, so a partition copied over another rank's, or a model-states file from
// another step, would load silently. Ours carry, at their top level (DeepSpeed ignores unknown
// keys): dscpp_save_id (16 hex digits, drawn by rank 0 and shared by every file of the save),
// dscpp_rank (the rank that wrote it), dscpp_world_size (the ranks it was written for) and
// dscpp_global_steps. A load checks every partition against the tag's model-states file;
// loading onto another number of ranks stays allowed (it is the files that must agree, not the
// files and the engine). Files without dscpp_save_id (DeepSpeed's) keep DeepSpeed's checks.
#pragma once

#include <cstdint>
#include <string>

#include "dscpp/runtime/checkpoint/torch_file.h"

namespace dscpp::checkpoint {

struct SaveBinding {
  std::string save_id;  // empty: a file without one (DeepSpeed's)
  int64_t rank = -1, world_size = -1, global_steps = -1;
};

// 64 random bits as 16 hex digits.
std::string new_save_id();
// Sets the dscpp_* keys of `file` (a dict).
void write_binding(PyValue& file, const SaveBinding& b);
// The dscpp_* keys of `file`; a model-states file without them gives its DeepSpeed keys
// (dp_world_size, global_steps). Throws CheckpointError naming `path` on a malformed one.
SaveBinding read_binding(const PyValue& file, const std::string& path);
// Throws CheckpointError naming both files and both values unless the partition file at
// `part_path`, the one of rank `rank`, belongs to the save of the model-states file.
void check_partition_binding(const SaveBinding& model, const std::string& model_path,
                             const SaveBinding& part, const std::string& part_path, int rank);

}  // namespace dscpp::checkpoint
