// DeepSpeed's deepspeed.zero.GatheredParameters over the engine's set of ZeRO partitions
// (engine_core.h, ZeroPartition): each named parameter is gathered by the partition that holds
// it (the dense one, Muon's matrices, the experts'), one zero::GatheredParameters each; the
// dense partition's scope takes those none holds (frozen ones: whole already; a modifier's
// change to them is broadcast). With modifier_rank >= 0 a parameter of the experts' partition
// (ep_size > 1) is refused: each expert-parallel place holds other experts, so one data rank's
// values are not every rank's. Collective, as zero::GatheredParameters is, in the set's order.
#pragma once

#include <memory>
#include <vector>

#include "dscpp/zero/gathered_parameters.h"

namespace dscpp {

class GatheredParameterSet {
 public:
  explicit GatheredParameterSet(std::vector<std::unique_ptr<zero::GatheredParameters>> scopes)
      : scopes_(std::move(scopes)) {}
  // One scope per partition holding a named parameter, the dense one's first (always there).
  const std::vector<std::unique_ptr<zero::GatheredParameters>>& scopes() const { return scopes_; }

 private:
  std::vector<std::unique_ptr<zero::GatheredParameters>> scopes_;
};

}  // namespace dscpp
