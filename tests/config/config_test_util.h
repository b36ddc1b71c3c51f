// What the ds_config tests share.
#pragma once

#include <nlohmann/json.hpp>

#include "dscpp/config/ds_config.h"

namespace config_test {

// `j` read as a ds_config, with train_micro_batch_size_per_gpu 1 (the batch rule needs one
// batch key).
inline dscpp::DSConfig parse(nlohmann::json j) {
  j["train_micro_batch_size_per_gpu"] = 1;
  return dscpp::parse_ds_config(j);
}

}  // namespace config_test
