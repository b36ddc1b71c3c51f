// The engine's side of tensor parallelism (Megatron's finalize_model_grads, for a ZeRO
// partition): a model-parallel group of t ranks holds, at the same data index, the slices of
// the split parameters and t replicas of the others. ZeRO partitions and reduces over the data
// group only; this adds the two model-group facts the step needs, on ZeRO's reduced gradient
// partition (after the data-parallel reduction: the sums commute, as pipe/tied_grads.h's do):
// - sequence-parallel parameters (TensorParallelAttr::sequence_parallel: the replicated
//   LayerNorms used on 1/t of the sequence) hold partial gradients per rank: summed over the
//   model group before the step, so every replica takes the same update;
// - the global norm (clip, overflow verdict) counts each parameter once: the split ones on
//   every rank, a replica on model rank 0 only (param_is_not_tensor_parallel_duplicate), and
//   the sum of squares is then summed over the model group.
// Every model rank must hold the same parameter shapes in the same order (the same ZeRO
// layout), as the ranks of one TensorParallelGPT do.
// Stage 3 is no different: each tensor rank's shards are its own parameters, partitioned,
// gathered and reduce-scattered over the data group, and the reduced partition is all the
// gradient there is by the step. The sequence-parallel sum runs on it, after the
// reduce-scatter: model ranks at one data index own the same chunk of the same layout, so
// summing their partitions' SP slices gives the sum over every rank. Before the reduce-scatter
// (Megatron's place) is as correct, but costs a collective in backward per micro-step.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

class TensorParallelGrads {
 public:
  // attrs: one per ZeRO parameter (zero.params() order). model_group: this rank's
  // model-parallel group.
  TensorParallelGrads(zero::ZeroOptimizer& zero, std::shared_ptr<comm::ProcessGroup> model_group,
                      std::vector<nn::TensorParallelAttr> attrs);

  // At the accumulation boundary, before the step: the sequence-parallel parameters'
  // gradient slices summed over the model group (one all-reduce; none when there are none).
  void all_reduce_sequence_parallel();
  // This rank's sum of squares of the replicas it must not count (0 on model rank 0): what
  // the local sum of squares loses before it is summed over the model group. 0-dim fp32.
  at::Tensor duplicate_sumsq() const;
  comm::ProcessGroup& model_group() { return *group_; }
  bool has_sequence_parallel() const { return any_sp_; }

 private:
  struct Slice {
    int64_t part, numel;  // where in the gradient partition, how many elements
  };
  std::vector<Slice> slices(int param) const;  // the part of param's gradient this rank holds

  zero::ZeroOptimizer& zero_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<nn::TensorParallelAttr> attrs_;
  bool any_sp_ = false;
};

}  // namespace dscpp
