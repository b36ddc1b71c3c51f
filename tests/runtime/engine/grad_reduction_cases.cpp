// DeepSpeed's gradient-reduction keys, each shown by its effect on 2 ranks at ZeRO 0-3:
//  - communication_data_type: the sum runs in that type (fp16 rounds 1 + 2^-12 to 1; fp32 does
//  not);
//  - prescale_gradients: each rank divides by the world before the sum, so two fp16 gradients
//    of 40000 sum to 40000 instead of overflowing at 80000;
//  - gradient_predivide_factor: divides by the factor before the sum and multiplies by
//    factor / world after (DeepSpeed's engine.allreduce_bucket), which also keeps it finite.
// The model is one weight w = 0.5 with loss w * c_rank, so each rank's gradient is c_rank, and
// SGD at lr 1 leaves w - mean(c) with the reduction's rounding: every expected value below is
// worked out by hand (and exact in fp32). Exits 0 when every case holds on this rank.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <iostream>
#include <limits>
#include <string>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"

using nlohmann::json;

namespace {

struct Case {
  const char* name;
  json keys;          // top-level keys added to the ds_config
  double c0, c1;      // the gradient on rank 0 and on rank 1
  double expected_w;  // w after one step; -inf: the reduction overflowed
};

double one_step(const Case& c, int stage, const dscpp::InitArgs& args, int rank) {
  torch::nn::Linear net(torch::nn::LinearOptions(1, 1).bias(false));
  {
    at::NoGradGuard no_grad;
    net->weight.fill_(0.5);
  }
  json cfg = {{"train_batch_size", 2},
              {"gradient_clipping", 0.0},  // (DeepSpeed's default, 1.0, would hide the sums)
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 1.0}}}}},
              {"zero_optimization", {{"stage", stage}}}};
  cfg.update(c.keys);
  auto engine = dscpp::initialize(net, cfg, args);
  const double g = rank == 0 ? c.c0 : c.c1;
  at::Tensor x = at::full({1, 1}, g, at::kFloat).to(engine.device());
  engine.backward(engine.forward(x).sum());
  engine.step();
  auto full = engine.gathered_parameters({net->weight});  // (stage 3 keeps only partitions)
  return net->weight.item<double>();
}

}  // namespace

int main() try {
  const double inf = -std::numeric_limits<double>::infinity();
  const double tiny = std::ldexp(1.0, -12);  // under half of fp16's spacing at 1 (2^-10)
  const Case cases[] = {
      {"fp32 sum", json::object(), 40000, 40000, 0.5 - 40000},
      {"fp32 keeps 1 + 2^-12", json::object(), 1 + tiny, 1, 0.5 - (1 + tiny / 2)},
      {"fp16 rounds 1 + 2^-12 to 1", {{"communication_data_type", "fp16"}}, 1 + tiny, 1, -0.5},
      {"fp16 sum of 2 x 40000 overflows", {{"communication_data_type", "fp16"}}, 40000, 40000, inf},
      {"fp16 prescaled",
       {{"communication_data_type", "fp16"}, {"prescale_gradients", true}},
       40000,
       40000,
       0.5 - 40000},
      {"fp16 predivided by 2",
       {{"communication_data_type", "fp16"}, {"gradient_predivide_factor", 2.0}},
       40000,
       40000,
       0.5 - 40000},
      // Predivided by 4 (not the world): 3/4 + 5/4 = 2, then x 4 / 2 (not / 2: -0.5).
      {"fp32 predivided by 4", {{"gradient_predivide_factor", 4.0}}, 3, 5, 0.5 - 4},
  };
  auto group = dscpp::comm::init_distributed();
  const int rank = group->rank();
  if (group->size() != 2) throw std::runtime_error("start with 2 ranks");
  dscpp::InitArgs args;
  args.group = group;
  int failures = 0;
  for (int stage = 0; stage <= 3; ++stage) {
    for (const Case& c : cases) {
      const double w = one_step(c, stage, args, rank);
      const bool ok = std::isinf(c.expected_w) ? (std::isinf(w) && w < 0) : w == c.expected_w;
      if (!ok) {
        ++failures;
        std::cerr << "rank " << rank << ": FAILED: stage " << stage << ", " << c.name << ": w " << w
                  << ", expected " << c.expected_w << "\n";
      }
    }
  }
  if (failures == 0 && rank == 0) std::cout << "grad_reduction_cases: all checks passed\n";
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "grad_reduction_cases: " << e.what() << "\n";
  return 1;
}
