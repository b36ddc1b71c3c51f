// The analytic checker of pipe/schedule.h's contract: all stages' instruction lists of one
// pipeline shape simulated together, without a model. check_* return "" when the lists keep
// the contract, else the first violation in words (step, stage, instruction).
#pragma once

#include <string>
#include <vector>

#include "dscpp/pipe/schedule.h"

namespace dscpp::pipe::testing {

struct Pipeline {
  int stages = 1, micro_batches = 1, chunks = 1;
  bool training = true;
  std::vector<std::vector<Step>> lists;  // lists[s]: stage s's steps
};
Pipeline build(int stages, int micro_batches, int chunks, bool training);

// Alignment, step order, Send/Recv matching and per-link order, dependency order, every
// (micro-batch, chunk) forward once (and backward once), buffer slots never shared while live.
std::string check_contract(const Pipeline& pipe);

// Event simulation with forward time F and backward time B per stage (a chunk takes F/v,
// B/v): a stage runs its steps in order; a step's transfers complete together when every
// peer has reached that step (zero latency); then its compute runs. Returns the makespan.
struct Timing {
  double makespan = 0;
  std::vector<double> busy;  // per stage: compute time
};
Timing simulate(const Pipeline& pipe, double F, double B);

}  // namespace dscpp::pipe::testing
