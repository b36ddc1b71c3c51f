// The ds_config keys that set ZeRO's options, each mapped once to the options it sets: one row
// per key (zero_option_keys), run in order by zero_options_from. A row copies its own key's
// value; it may read other keys only as the condition that makes its option apply (an offload
// section's device, the stage). What the config cannot say (the job's rank, whether a GPU is
// there, the parameters, tensor parallelism, the client's parameter groups) the engine adds.
// config/key_fates.cpp gives every key its fate; tests/runtime/engine/test_zero_options_from.cpp
// holds the two tables to each other (a key here is one key_fates marks acted on, and every
// acted-on ZeRO key is here or named there as read elsewhere).
#pragma once

#include <cstdint>
#include <vector>

#include "dscpp/config/ds_config.h"
#include "dscpp/zero/layer_gather.h"
#include "dscpp/zero/zero_optimizer.h"

namespace dscpp {

// What the config decides of ZeRO.
struct ZeroSettings {
  zero::ZeroOptions zero;                 // the ZeroOptimizer's
  zero::LayerGatherOptions layer_gather;  // stage 3 gathering layer by layer
  // Stage 3: parameters of at most param_persistence_threshold elements, together at most
  // model_persistence_threshold, stay whole (DeepSpeed's persistence thresholds).
  int64_t param_persistence_threshold = 0;
  int64_t model_persistence_threshold = 0;
};

// Facts of the running job that some options take beside their key.
struct ZeroJobFacts {
  int rank = 0;       // the global rank: the NVMe swap folders' names
  bool cuda = false;  // page-locked NVMe buffers only where a GPU is
};

struct ZeroOptionKey {
  const char* key;  // the canonical dotted path (config/key_fates.h)
  void (*set)(const DSConfig& config, const ZeroJobFacts& job, ZeroSettings& out);
};

// The table, one row per key, no key twice.
const std::vector<ZeroOptionKey>& zero_option_keys();

// Every row applied to default settings. Throws ConfigError on a value the options cannot
// take (data_types.grad_accum_dtype neither fp32 nor the training type).
ZeroSettings zero_options_from(const DSConfig& config, const ZeroJobFacts& job);

}  // namespace dscpp
