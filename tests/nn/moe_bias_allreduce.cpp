// Bias-based balancing over a data group (2 Gloo ranks through the launcher): each rank routes
// its own batch (rank 0's skewed towards the first experts, rank 1's towards the last), then
// update_expert_biases(model, world) must give every rank the bias that the counts of both
// batches give by hand, rate · sign(mean - count), which differs from either rank's own.
#include <ATen/ATen.h>

#include <iostream>

#include "dscpp/comm/process_group.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/nn/moe/router.h"

namespace moe = dscpp::nn::moe;

namespace {

moe::TopKGate make_gate() {
  moe::TopKGate gate(moe::TopKGateOptions(8, 8)
                         .k(2)
                         .top2_2nd_expert_sampling(false)
                         .capacity_factor(0)
                         .score_function(moe::ScoreFunction::kSigmoid)
                         .enable_expert_bias(true)
                         .bias_update_rate(0.01));
  at::NoGradGuard g;
  gate->wg->weight.copy_(at::eye(8));
  return gate;
}

at::Tensor batch(int rank) {
  auto gen = at::detail::createCPUGenerator(100 + rank);
  at::Tensor skew = at::linspace(1.0, -1.0, 8) * (rank == 0 ? 1.0 : -0.5);
  return at::randn({64, 8}, gen, at::TensorOptions().dtype(at::kFloat)) * 0.5 + skew;
}

}  // namespace

int main() {
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  auto world = dscpp::comm::init_distributed(options);
  const int rank = world->rank();
  int failures = 0;

  auto gate = make_gate();
  gate->forward(batch(rank));
  moe::update_expert_biases(*gate, world);

  // By hand: both ranks' counts from a gate of its own.
  auto counts = [&](int r) {
    auto g = make_gate();
    return g->forward(batch(r)).exp_counts.to(at::kDouble);
  };
  at::Tensor total = counts(0) + counts(1);
  at::Tensor want = at::sign(total.mean() - total) * 0.01;
  at::Tensor own = at::sign(counts(rank).mean() - counts(rank)) * 0.01;
  if (!at::allclose(gate->expert_bias.to(at::kDouble), want, 0, 1e-9)) {
    std::cerr << "rank " << rank << ": bias " << gate->expert_bias << " want " << want << "\n";
    ++failures;
  }
  if (at::equal(want, own)) {
    std::cerr << "rank " << rank << ": the case does not tell the group's counts from its own\n";
    ++failures;
  }
  if (gate->tokens_per_expert().abs().sum().item<double>() != 0) {
    std::cerr << "rank " << rank << ": the counts were not restarted\n";
    ++failures;
  }
  world->barrier().wait();
  std::cout << "rank " << rank << ": " << (failures ? "FAILED" : "ok") << "\n";
  return failures ? 1 : 0;
}
