// GatheredParameters: DeepSpeed's deepspeed.zero.GatheredParameters for dscpp's stage 3. For
// the scope's life the module's parameters hold their full values (all-gathered on every
// rank); at its end they go back to rest. With modifier_rank >= 0, what that rank wrote into
// them in the scope becomes every rank's value (its partitions, 16-bit and fp32, included).
// Collective: every rank opens and closes the scope. At stages 0-2 it does nothing.
#pragma once

#include "dscpp/zero/zero_optimizer.h"

namespace dscpp::zero {

class GatheredParameters {
 public:
  explicit GatheredParameters(ZeroOptimizer& zero, int modifier_rank = -1)
      : zero_(zero), modifier_rank_(modifier_rank), was_gathered_(zero.gathered()) {
    zero_.gather();
  }
  ~GatheredParameters() {
    if (modifier_rank_ >= 0) zero_.scatter_gathered_from(modifier_rank_);
    if (!was_gathered_) zero_.release();
  }
  GatheredParameters(const GatheredParameters&) = delete;
  GatheredParameters& operator=(const GatheredParameters&) = delete;

 private:
  ZeroOptimizer& zero_;
  int modifier_rank_;
  bool was_gathered_;
};

}  // namespace dscpp::zero
