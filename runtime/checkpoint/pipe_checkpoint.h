// A pipeline checkpoint (pipe_layout.h's files) read whole, so that any layout loads it: every
// saved stage's model states (mp_rank_<stage>), the module's state dict under whole-model names
// from the layer files, and each trainable parameter whole (fp32 weights, optimizer states)
// from its stage's ZeRO partitions or stage-0 optimizer state. The pipeline engine records in
// each stage's model states (key dscpp_pipe) the layer files it wrote: their global index, the
// name their keys sit under in the whole model, and a digest of their bytes, so that a layer
// file of another run or a missing one is refused, naming it. Reads files only.
#pragma once

#include <string>
#include <vector>

#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/checkpoint/universal.h"

namespace dscpp::checkpoint {

// One layer file a stage wrote, as dscpp_pipe's "layers" entries list them.
struct PipeLayerFile {
  int index = 0;       // the global layer index (layer_<index>-...)
  std::string prefix;  // whole-model name of its module ("layers.3"; a tied key's first spec)
  std::string file;    // file name inside the tag folder
  std::string digest;  // file_digest() of what was written
};

// The dscpp_pipe entry of a stage's model states; model_rank / model_parallel_size: its
// tensor-parallel coordinate (a 3D pipeline; 0 / 1 without a model axis).
PyValue pipe_entry(int stages, int stage, int data_parallel_size,
                   const std::vector<PipeLayerFile>& layers, int model_rank = 0,
                   int model_parallel_size = 1);
// Whether a model-states file is a pipeline stage's (holds dscpp_pipe).
bool is_pipe_checkpoint(const PyValue& model_states);
// 16 hex digits: FNV-1a over the file's bytes (detects a file swapped in from another save).
std::string file_digest(const std::string& path);
// The ZeRO partition of data rank dp_rank of a stage (and model rank, of model_size), with or
// without the bf16_ prefix.
std::string find_pipe_zero_states(const std::string& dir, const std::string& tag, int dp_rank,
                                  int stage, int model_rank = 0, int model_size = 1);

// A 3D checkpoint (model axis t > 1) is read whole too: each (stage, model rank) writes its
// own mp_rank_<stage*t+model> model states, layer_XX-model_TT files and ZeRO partitions, and
// its model states hold dscpp_tensor_parallel (each parameter's partition metadata); every
// split tensor (module, fp32 weights, optimizer states) is merged over the t model ranks
// (tp_reshape.h), so `module` and `params` are the one-rank model's whatever saved them. A
// stage with expert parallelism writes DeepSpeed's MoE layout per tensor rank
// (moe_pipe_stage.h under mp_rank_<stage*t+model>): its experts, replicated over the tensor
// ranks, are read from tensor rank 0's files; its dense tensors are merged like the others.
struct PipeCheckpoint {
  int stages = 0, data_parallel_size = 0, model_parallel_size = 1;
  std::vector<std::string> model_paths;  // per saved (stage, model rank): stage * t + model
  std::vector<PyValue> models;           // the same order
  PyValue module;                        // name -> tensor, by layer index, the first holder's
  std::vector<UniversalParam> params;    // the trainable ones, each once (its first stage's),
                                         // whole; partition: how the save cut it
  PyValue optimizer_state;               // the optimizer's settings (stage 0, model rank 0's):
                                         // what a universal zero/optimizer_state.pt holds
};

// Reads <dir>/<tag>/ of a pipeline checkpoint. Refuses, naming the file: a missing stage's
// model states or layer file, model states or a layer file of another save, a ZeRO partition
// of another save.
PipeCheckpoint read_pipe_checkpoint(const std::string& dir, const std::string& tag);

}  // namespace dscpp::checkpoint
