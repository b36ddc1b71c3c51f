// How a PipelineModule cuts its layers into parts (DeepSpeed's partition_method): "uniform"
// (equal layer counts, the first parts one more where they do not divide), "parameters" (the
// default: balanced trainable-parameter counts), "type:REGEX" (balanced counts of the layers
// whose module type matches REGEX, case-insensitive). Returns parts+1 boundaries: part k is
// [bounds[k], bounds[k+1]), none empty. Bad methods throw dscpp::Error naming them.
#pragma once

#include <string>
#include <vector>

#include "dscpp/nn/layer_spec.h"

namespace dscpp::pipe {

std::vector<int> partition_layers(const std::vector<nn::LayerSpec>& specs, int parts,
                                  const std::string& method);

// The contiguous split of weights into parts non-empty parts whose largest sum is smallest
// (DeepSpeed's partition_balanced); ties go to the earliest boundaries.
std::vector<int> partition_balanced(const std::vector<double>& weights, int parts);
std::vector<int> partition_uniform(int items, int parts);

}  // namespace dscpp::pipe
