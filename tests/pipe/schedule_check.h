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
  ScheduleKind kind = ScheduleKind::kAuto;
};
Pipeline build(int stages, int micro_batches, int chunks, bool training,
               ScheduleKind kind = ScheduleKind::kAuto);

// Alignment, step order, Send/Recv matching and per-link order, dependency order, every
// (micro-batch, chunk) forward once (and backward once: whole, or B then W), buffer slots
// never shared while live.
std::string check_contract(const Pipeline& pipe);

// Event simulation with forward time F and backward time B per stage (a chunk takes F/v,
// B/v; a split backward's B takes B - W and its W takes W): a stage runs its steps in order;
// a step's transfers complete together when every peer has reached that step (zero latency);
// then its compute runs. Returns the makespan.
struct Timing {
  double makespan = 0;
  std::vector<double> busy;  // per stage: compute time
};
Timing simulate(const Pipeline& pipe, double F, double B, double W = 0);

// The most micro-batches stage s holds between their forward and their backward (B where
// split), and between their forward and their W (the backward where whole).
struct InFlight {
  int until_backward = 0, until_weight = 0;
};
InFlight in_flight(const Pipeline& pipe, int stage);

}  // namespace dscpp::pipe::testing
