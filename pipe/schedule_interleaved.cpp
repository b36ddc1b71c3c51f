// Megatron's interleaved 1F1B as aligned steps (in progress: refused for now).
#include <fmt/format.h>

#include "dscpp/error.h"
#include "dscpp/pipe/schedule_internal.h"

namespace dscpp::pipe {

std::vector<Step> interleaved_train_schedule(const PipeShape& shape) {
  throw Error(fmt::format("pipeline schedule: chunks = {} (interleaved 1F1B) is not supported yet",
                          shape.chunks));
}

}  // namespace dscpp::pipe
