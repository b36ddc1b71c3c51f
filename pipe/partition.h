// Stage partitioning as DeepSpeed's PipelineModule._partition_layers does it, as pure
// functions on what each layer is (its type name, its trainable parameter count): the
// boundaries parts[0..num_stages], stage s holding layers [parts[s], parts[s + 1]).
//
// Methods (DeepSpeed's `partition_method`, lower-cased first as DeepSpeed does):
// - "parameters" (the default): balance the trainable parameter counts
//   (ds_utils.partition_balanced: the split minimising the largest minus the smallest part).
// - "uniform": the same number of layers per stage, the first (n mod p) stages one more
//   (ds_utils.partition_uniform).
// - "type:REGEX": balance the layers whose type name the regex finds (searched, case
//   insensitive; like DeepSpeed only the text between the first and a second ':' is the
//   regex). No such layer: PartitionError, as DeepSpeed's RuntimeError.
// More stages than layers: as DeepSpeed, every method falls back to one layer per stage
// and the last stages are empty (parts[s] = min(s, n)); refusing an empty stage is the
// pipeline module's business. An unknown method ("profile" included) is refused.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::pipe {

class PartitionError : public dscpp::Error {
 public:
  using dscpp::Error::Error;
};

struct LayerInfo {
  std::string type_name;  // DeepSpeed's LayerSpec.typename.__name__; "": none (never matches type:)
  std::int64_t trainable_params = 0;  // parameters with requires_grad, counted once per layer
};

std::vector<int> partition_uniform(int num_items, int num_parts);
std::vector<int> partition_balanced(const std::vector<std::int64_t>& weights, int num_parts);
std::vector<int> partition_layers(const std::string& method, const std::vector<LayerInfo>& layers,
                                  int num_stages);

}  // namespace dscpp::pipe
