// The gradients of tied layers (TiedLayerSpec) on several stages: summed among the stages
// that hold them before the step (DeepSpeed's ReduceTiedGrads), and counted once in the
// global norm. Works on ZeRO's reduced gradient partition, after the data-parallel
// reduction (the two sums commute): at stage 0 each rank holds the whole averaged gradient
// and sums it with its peers of the same data index; at stages 1-2 each rank holds a slice
// that differs between stages (their layouts differ), so the slices go into a zero tensor of
// the whole parameter, summed over every data rank of those stages, and each takes its
// slice back.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "dscpp/pipe/pipeline_module.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::pipe {

class TiedGrads {
 public:
  // After the engine has attached the stage module: finds each tied weight among ZeRO's
  // parameters (throws dscpp::Error naming one that is not trainable there).
  TiedGrads(const PipelineModule& module, zero::ZeroOptimizer& zero);

  // Collective over each tied key's stages.
  void all_reduce();
  // This rank's sum of squares of the tied gradients it holds as a copy (the stages after
  // each key's first holder): what the global norm must not count twice. 0-dim fp32.
  at::Tensor duplicate_sumsq() const;
  bool empty() const { return weights_.empty(); }

 private:
  struct Weight {
    const PipelineModule::Tied* tied;
    int param;  // index into ZeRO's parameters
    bool copy;  // this stage is not the key's first holder
  };
  // The part of parameter i's gradient this rank's partition holds: [begin, end) of the
  // parameter's elements, and where it sits in the partition.
  struct Slice {
    int64_t begin, end, part;
  };
  std::vector<Slice> slices(int param) const;

  zero::ZeroOptimizer& zero_;
  std::vector<Weight> weights_;
};

}  // namespace dscpp::pipe
