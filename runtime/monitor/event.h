// The one thing every monitor takes: a named scalar at a step, DeepSpeed's
// (log_name, value, step) tuple. Kept apart so that the monitors need no config headers.
#pragma once

#include <cstdint>
#include <string>

namespace dscpp::monitor {

// e.g. ("Train/Samples/train_loss", 2.31, 640), where DeepSpeed's step is the number of
// samples seen so far.
struct Event {
  std::string name;
  double value = 0;
  int64_t step = 0;
};

}  // namespace dscpp::monitor
