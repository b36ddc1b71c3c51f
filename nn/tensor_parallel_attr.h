// How a parameter is laid across a model-parallel group, as Megatron marks it
// (set_tensor_model_parallel_attributes: tensor_model_parallel, partition_dim,
// partition_stride; and `sequence_parallel` on the replicated parameters used on a sequence
// shard). One description, read by whatever needs the unsharded view: the checkpoint's
// reshaping across tensor-parallel degrees (which dimension to cut or concatenate, and in how
// many interleaved pieces), the gradient norm (a replicated parameter counted once, not t
// times), and the step (sequence-parallel gradients summed over the group first).
//
// A parameter of the full shape P split with partition_dim d and partition_stride s over t
// ranks: P is cut along d into t·s equal pieces, and rank r holds pieces r, r+t, r+2t, ...
// concatenated along d (s = 1: the r-th of t contiguous slices). The modules that hold split
// parameters say so through TensorParallelModule; every other parameter is replicated.
#pragma once

#include <torch/nn/module.h>

#include <map>
#include <string>

#include "dscpp/nn/tensor_parallel_mappings.h"

namespace dscpp::nn {

struct TensorParallelAttr {
  bool tensor_model_parallel = false;  // this rank holds a slice; false: a whole replica
  int64_t partition_dim = -1;          // the dimension cut across the group; -1: replicated
  int64_t partition_stride = 1;        // interleaved pieces per rank (see above); 1: one slice
  bool sequence_parallel = false;      // replicated, but applied to 1/t of the sequence: each
                                       // rank's gradient is a partial sum over the group
};

// Implemented by the modules that own split (or sequence-parallel) parameters.
class TensorParallelModule {
 public:
  virtual ~TensorParallelModule() = default;
  // By the parameter's local name ("weight", "bias"); parameters not listed are replicated.
  virtual std::map<std::string, TensorParallelAttr> tensor_parallel_attributes() const = 0;
};

// Every parameter of `root` by its dotted name (as named_parameters() spells it), each with
// its attributes: those its TensorParallelModule gives, replicated defaults for the others.
std::map<std::string, TensorParallelAttr> tensor_parallel_attributes(const torch::nn::Module& root);

// Megatron's param_is_not_tensor_parallel_duplicate: whether this rank's copy counts in a sum
// over the model group (the gradient norm): a split parameter on every rank, a replica only on
// model-parallel rank 0.
bool param_is_not_tensor_parallel_duplicate(const TensorParallelAttr& attr, int tp_rank);

// Sums over `group` the gradients of the parameters marked sequence_parallel (LayerNorms and
// row-parallel biases in a sequence-parallel region; Megatron's _allreduce_layernorm_grads),
// so that each replica holds the whole gradient. Run after backward, before the step; a
// parameter without a gradient is skipped. One all-reduce per parameter.
void all_reduce_sequence_parallel_grads(const torch::nn::Module& root, const GroupPtr& group);

}  // namespace dscpp::nn
