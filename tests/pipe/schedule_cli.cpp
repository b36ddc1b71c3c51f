// Prints pipe::train_schedule / inference_schedule for each "train|inference STAGES MICRO_BATCHES"
// line of stdin: one JSON line per case, {stage: [[to_string(instruction), ...] per step]}.
// tests/pipe/compare_schedule.py compares them with DeepSpeed's TrainSchedule / InferenceSchedule.
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "dscpp/pipe/schedule.h"

int main() {
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string kind;
    int p = 0, m = 0;
    in >> kind >> p >> m;
    nlohmann::json out = nlohmann::json::array();
    for (int s = 0; s < p; ++s) {
      const dscpp::pipe::PipeShape shape{p, s, m, 1};
      const auto steps = kind == "train" ? dscpp::pipe::train_schedule(shape)
                                         : dscpp::pipe::inference_schedule(shape);
      nlohmann::json stage = nlohmann::json::array();
      for (const auto& step : steps) {
        nlohmann::json cmds = nlohmann::json::array();
        for (const auto& i : step) cmds.push_back(dscpp::pipe::to_string(i));
        stage.push_back(cmds);
      }
      out.push_back(stage);
    }
    std::cout << out.dump() << "\n";
  }
  return 0;
}
