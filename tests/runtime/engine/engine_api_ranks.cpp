// engine.gathered_parameters on 2 ranks, run by the launcher (tests/runtime/engine/
// CMakeLists.txt). --case gather: at stage 3 only the named parameters' buckets are
// all-gathered (ZeroOptimizer::gathers()); at every stage the modifier rank's change is
// every rank's value afterwards, in the parameters and in the fp32 master copy (an lr 0
// step publishes the master: a stale one would undo it). --case exit_failure: the peer
// leaves inside a scope with a modifier, so the broadcast in the scope's destructor fails;
// the destructor does not throw, and the engine's next call (and every one after) throws
// dscpp::Error naming the failure. Exits 0 when every check holds on this rank.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <unistd.h>

#include <iostream>
#include <string>

#include "dscpp/dscpp.h"
#include "dscpp/zero/zero_optimizer.h"

using nlohmann::json;

namespace {

int failures = 0;
int rank_ = -1;
void check(bool ok, const std::string& what) {
  if (!ok) {
    std::cerr << "rank " << rank_ << ": FAILED: " << what << "\n";
    ++failures;
  }
}

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(4, 8));
    b = register_module("b", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(at::Tensor x) { return b(a(x).tanh()); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

json config(int stage) {
  return {{"train_batch_size", 2},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.0}, {"weight_decay", 0.0}}}}},
          {"zero_optimization",
           {{"stage", stage},
            {"reduce_bucket_size", 1},  // a bucket per parameter
            {"stage3_param_persistence_threshold", 0}}}};
}

// The same value on every rank: max and min over the group agree.
bool same_everywhere(dscpp::comm::ProcessGroup& g, at::Tensor t) {
  at::Tensor hi = t.clone(), lo = -t;
  g.all_reduce(hi, dscpp::comm::ReduceOp::kMax).wait();
  g.all_reduce(lo, dscpp::comm::ReduceOp::kMax).wait();
  return at::equal(hi, -lo);
}

void gather_case(int stage, std::shared_ptr<dscpp::comm::ProcessGroup>& group) {
  const std::string at_stage = " (stage " + std::to_string(stage) + ")";
  torch::manual_seed(0);
  Net net;
  dscpp::InitArgs args;
  args.group = group;
  auto engine = dscpp::initialize(net, config(stage), args);
  if (!group) group = engine.data_parallel_group().shared_from_this();
  rank_ = engine.global_rank();
  auto& zo = engine.core().zero_optimizer();
  const int64_t before = zo.gathers();
  {
    auto edit = engine.gathered_parameters({net->b->weight}, /*modifier_rank=*/1);
    if (stage == 3) {
      check(zo.gathers() == before + 1, "one bucket gathered for b.weight" + at_stage);
      check(net->a->weight.numel() == 0 && net->b->bias.numel() == 0,
            "the parameters not named stay at rest" + at_stage);
    }
    check(net->b->weight.sizes() == at::IntArrayRef({2, 8}), "b.weight whole" + at_stage);
    at::NoGradGuard no_grad;
    if (rank_ == 1) net->b->weight.fill_(0.5);  // only rank 1 changes it
  }
  if (stage == 3)
    for (size_t b = 0; b < zo.layout().buckets.size(); ++b)
      check(zo.bucket_state(static_cast<int>(b)) == dscpp::zero::ZeroOptimizer::BucketState::kRest,
            "every bucket back at rest" + at_stage);
  // A step with lr 0: the parameters come back from the fp32 master.
  at::Tensor x = at::ones({1, 4});
  engine.backward(engine.forward(x).square().mean());
  engine.step();
  auto all = engine.gathered_parameters(net->parameters());
  check(at::all(net->b->weight == 0.5).item<bool>(),
        "rank 1's change reached this rank" + at_stage);
  for (const auto& p : net->parameters())
    check(same_everywhere(engine.data_parallel_group(), p.detach().clone()),
          "parameters agree across ranks" + at_stage);
}

void exit_failure_case() {
  Net net;
  auto engine = dscpp::initialize(net, config(3));
  rank_ = engine.global_rank();
  engine.data_parallel_group().barrier().wait();
  {
    auto edit = engine.gathered_parameters({net->b->weight}, /*modifier_rank=*/1);
    // Rank 1 leaves without closing the scope: rank 0's broadcast from it must fail.
    if (rank_ == 1) ::_exit(0);
  }  // no exception leaves here
  for (int call = 0; call < 2; ++call) {
    std::string what;
    try {
      engine.forward(at::ones({1, 4}));
    } catch (const dscpp::Error& e) {
      what = e.what();
    }
    check(what.find("GatheredParameters failed when it closed") != std::string::npos &&
              what.find("cannot go on") != std::string::npos,
          "engine call " + std::to_string(call) + " after the failed scope throws: '" + what + "'");
  }
}

}  // namespace

int main(int argc, char** argv) try {
  std::string which;  // the launcher may add its own arguments (--local_rank=N)
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--case") which = argv[i + 1];
  if (which == "gather") {
    std::shared_ptr<dscpp::comm::ProcessGroup> group;  // the first engine's, then shared
    for (int stage : {3, 0, 1, 2}) gather_case(stage, group);
  } else if (which == "exit_failure") {
    exit_failure_case();
    // The peer is gone: nothing may wait for it on the way out (the group's teardown).
    std::cout << "engine_api_ranks exit_failure: rank " << rank_
              << (failures == 0 ? " passed\n" : " failed\n") << std::flush;
    std::cerr << std::flush;
    ::_exit(failures == 0 ? 0 : 1);
  } else {
    std::cerr << "usage: engine_api_ranks --case gather|exit_failure\n";
    return 2;
  }
  if (failures == 0) std::cout << "engine_api_ranks " << which << ": rank " << rank_ << " passed\n";
  return failures == 0 ? 0 : 1;
} catch (const std::exception& e) {
  std::cerr << "engine_api_ranks: rank " << rank_ << ": " << e.what() << "\n";
  return 1;
}
