// What dscpp does with DeepSpeed features it does not implement. Features whose absence
// would silently change what is trained (compression, MoQ, progressive layer drop, NVMe
// offload ...) are refused with a ConfigError naming them; features that only observe or
// tune (profilers, loggers, ZeRO++ quantised communication ...) are accepted and listed in
// Diagnostics::ignored, which the engine prints once at start-up.
#pragma once

#include "dscpp/config/ds_config.h"
#include "dscpp/config/section.h"

namespace dscpp::config {

// Sections DeepSpeed itself removed in 0.19 (refused unless explicitly disabled).
void refuse_removed_features(Section& root, Diagnostics& diag);
// Features whose absence changes what is trained, refused when on: data_efficiency's
// curriculum learning and random-LTD, hybrid_engine, weight_quantization,
// gradient_allreduce_op "sum".
void refuse_training_changes(Section& root, Diagnostics& diag);
// ZeRO sub-features: NVMe refused, ZeRO++ and friends noted as ignored.
void note_zero_features(Section& zero, const ZeroConfig& c, Diagnostics& diag);
// Optimizer and scheduler names: ours, 1-bit variants run uncompressed, others refused.
void check_optimizer(Section& s, OptimizerConfig& c, Diagnostics& diag);
void check_scheduler(Section& s, const SchedulerConfig& c, Diagnostics& diag);
// The remaining top-level DeepSpeed keys: known, and noted when switched on.
void note_ignored_features(Section& root, const DSConfig& c, Diagnostics& diag);

}  // namespace dscpp::config
