// DeepSpeed's pipeline checkpoint layout (deepspeed/runtime/pipe/module.py, engine.py):
//   <dir>/<tag>/layer_<L>[-model_<T>]-model_states.pt    one layer's state_dict, once per stage
//   <dir>/<tag>/mp_rank_<M>_model_states.pt              each stage's engine state (module: None)
//   <dir>/<tag>/[bf16_]zero_pp_rank_<D>_mp_rank_<M>_optim_states.pt   ZeRO partition of data rank D
// L: the layer's index in the whole LayerSpec list (DeepSpeed's local index + _local_start),
//    two digits at least ({:02d}); a layer without state (a plain function) has no file, a
//    module without parameters (nn.ReLU) an empty one.
// T: the tensor-parallel coordinate, present when the topology has a `model` axis
//    (PipeModelDataParallelTopology, even of size 1), absent for PipeDataParallelTopology
//    (DeepSpeed's get_rank_repr omits the `data` and `pipe` axes).
// M: DeepSpeed's checkpoint_mp_rank under a pipeline, the engine's mpu being the pipeline
//    grid: grid.get_model_parallel_rank(), the rank's index among the ranks of its data
//    coordinate, i.e. stage * model_size + model_rank (axes pipe, data, model, the last
//    fastest). So every stage writes its own mp_rank file: 2 stages, 1 model rank:
//    mp_rank_00 (stage 0) and mp_rank_01 (stage 1).
// D: the rank in the stage's data-parallel group (DeepSpeed's dp_process_group rank).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

#include "dscpp/runtime/checkpoint/checkpoint_error.h"

namespace dscpp::checkpoint {

inline constexpr int kNoModelAxis = -1;  // model_rank for a topology without a `model` axis

// "layer_05-model_states.pt", "layer_05-model_01-model_states.pt", "layer_123-model_states.pt".
std::string layer_file_name(int global_layer, int model_rank = kNoModelAxis);
std::string layer_states_path(const std::string& dir, const std::string& tag, int global_layer,
                              int model_rank = kNoModelAxis);
// DeepSpeed's checkpoint_mp_rank of a pipeline rank: stage * model_size + model_rank.
int pipe_mp_rank(int stage, int model_rank, int model_size);
std::string pipe_model_states_path(const std::string& dir, const std::string& tag, int stage,
                                   int model_rank, int model_size);
std::string pipe_zero_states_path(const std::string& dir, const std::string& tag, int dp_rank,
                                  int stage, int model_rank, int model_size, bool bf16);

// One layer's state dict, in its order, keys as inside the layer ("weight", "0.bias").
using LayerState = std::vector<std::pair<std::string, at::Tensor>>;
// Writes it as DeepSpeed's save_state_dict does (torch.save of layer.state_dict(): an
// OrderedDict of tensors, each its own compact storage); torch.load(weights_only=True)
// opens it. Atomic (a temporary file renamed).
void save_layer_states(const LayerState& state, const std::string& path);
// Reads a layer file (ours or DeepSpeed's); CheckpointError naming the file if it is not a
// dict of string keys to tensors.
LayerState load_layer_states(const std::string& path);
// The file a rank of tensor-parallel coordinate model_rank (of model_size) loads for a
// layer, as DeepSpeed's load_state_dir finds it: the sorted files layer_<L>-*model_states.pt,
// the model_rank-th of them when there are model_size. No file, or files of another
// tensor-parallel size (DeepSpeed merges those for Megatron inference only): CheckpointError.
std::string find_layer_states(const std::string& dir, const std::string& tag, int global_layer,
                              int model_rank, int model_size);

}  // namespace dscpp::checkpoint
