// pipe_train's modes for the zero-bubble schedules and Muon (pipe_train.cpp's header says how
// each is run).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "tests/pipe/pipe_models.h"

namespace pipe_test {

// --mode schedules: ZB-H1 against 1F1B, bit for bit (pipe_schedules_mode.cpp).
int schedules_agree(const GroupPtr& world);
// --mode muon: "type": "Muon" on pipelines against the engine without one (pipe_muon_mode.cpp);
// checkpoint_dir: where a Muon pipeline's checkpoint goes ("": not checked).
int muon_cases(const GroupPtr& world, const json& cases, int steps,
               const std::string& checkpoint_dir);

}  // namespace pipe_test
