// Expert parallelism in the engine (runtime/engine/engine_experts.h), on real Gloo ranks: a tiny
// model (linear, MoE layer, linear; hidden 16, 8 experts) at expert parallelism E trains, fp32,
// like its reference, within 1e-5 relative: every micro-step's loss, every step's gradient norm
// (gradient_clipping is active, so an expert counted twice or averaged over the wrong group
// changes the weights), and after the steps every weight (an expert's against the matching
// expert of the reference). The engine finds the experts itself and reduces them over the
// expert-data group; everything else goes over the data group.
//   - dropless: against one rank with the same global batch (each rank also runs that
//     one-rank engine, on a group of itself, holding every expert). The loss carries no l_aux:
//     the balancing loss is each rank's own (DeepSpeed's), not the global batch's.
//   - with token dropping (capacity factor 0.5): against expert parallelism 1 on the same data
//     world (capacity and l_aux are per rank; here the loss carries 0.01 l_aux).
// Both models start from the same weights: the reference's, the EP model taking its slice of
// the experts (nn::moe::expert_parameters says which).
//   moe_engine --case e<E>k<k>d<dropless>s<shared>z<stage>c<clones>g<ga> [--case ...] [--steps N]
//   moe_engine --refusals
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>

#include <cmath>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/optim/muon.h"
#include "dscpp/zero/zero_optimizer.h"
#include "tests/moe_test_util.h"

using nlohmann::json;
namespace moe = dscpp::nn::moe;
using moe_test::Case, moe_test::check, moe_test::check_close, moe_test::counterpart,
    moe_test::GroupPtr, moe_test::kHidden;

namespace {

constexpr int64_t kMicro = 2, kSeq = 12;

struct NetImpl : torch::nn::Module {
  NetImpl(const Case& c, int ep, const GroupPtr& ep_group) {
    fc_in = register_module("fc_in", torch::nn::Linear(kHidden, kHidden));
    layer = register_module("moe", moe::MoE(moe_test::moe_options(c, ep, ep_group)));
    fc_out = register_module("fc_out", torch::nn::Linear(kHidden, kHidden));
    aux_coeff = c.dropless ? 0.0 : 0.01;
  }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& target) {
    at::Tensor h = at::tanh(fc_in(x));
    auto y = layer(h);
    at::Tensor loss = at::mse_loss(fc_out(y.output + h), target);
    return aux_coeff != 0 ? loss + aux_coeff * y.l_aux : loss;
  }
  torch::nn::Linear fc_in{nullptr}, fc_out{nullptr};
  moe::MoE layer{nullptr};
  double aux_coeff = 0;
};
TORCH_MODULE(Net);

// --muon TYPE: "type": TYPE ("Muon" or "MuonH") for the matrices, the experts' included (their
// partition steps by it), the auxiliary Adam for the rest. MuonH's Newton-Schulz runs in fp32
// on a CPU: the run is compared with the reference as SGD's is. DeepSpeed's Muon (gram) runs in
// fp16 on a CPU that has it (AVX512-FP16), where the reduction order's last bits become fp16
// roundings that Newton-Schulz amplifies (a 4-rank run without expert parallelism differs from
// one rank by 0.5% in 5 steps): for it only the division of the work is checked.
std::string muon;

json ds_config(int micro, const Case& c, int stage) {
  json out = moe_test::ds_config(micro, c.ga, stage, c.stage % 2 == 1);
  if (!muon.empty())
    out["optimizer"] = {{"type", muon},
                        {"params", {{"lr", 0.02}, {"adam_lr", 0.01}, {"momentum", 0.9}}}};
  return out;
}

// The global batch of (step, micro-step): rows [rows, kSeq, kHidden] inputs and targets, the
// same on every rank.
std::pair<at::Tensor, at::Tensor> batch(int step, int m, int64_t rows) {
  auto gen = at::detail::createCPUGenerator(1000 + 100 * step + m);
  at::Tensor x = at::randn({rows, kSeq, kHidden}, gen, at::TensorOptions().dtype(at::kFloat));
  at::Tensor y = at::randn({rows, kSeq, kHidden}, gen, at::TensorOptions().dtype(at::kFloat));
  return {x, y};
}

struct Groups {
  GroupPtr self, ep;
};

void run_case(dscpp::comm::ProcessGroup& world, const GroupPtr& world_ptr, const Groups& g,
              const Case& c, int steps) {
  const int rank = world.rank(), d = world.size();
  const std::string where = "case " + c.name + " on " + std::to_string(d) + " ranks: ";
  if (d % c.ep != 0) throw dscpp::Error(where + "ep must divide the world");

  // The reference: one rank with the global batch (dropless), or EP 1 on the same data world.
  at::manual_seed(7);
  Net ref_model(c, 1, nullptr);
  dscpp::InitArgs ref_args;
  ref_args.group = c.dropless ? g.self : world_ptr;
  const int ref_micro = c.dropless ? kMicro * d : kMicro;
  auto ref = dscpp::initialize(ref_model, ds_config(ref_micro, c, 0), std::move(ref_args));
  std::map<std::string, at::Tensor> ref_params;
  for (const auto& p : ref_model->named_parameters()) ref_params[p.key()] = p.value();

  Net model(c, c.ep, g.ep);
  const auto experts = moe::expert_parameters(*model);
  int64_t expert_numel = 0;  // (before the engine: stage 3 then keeps only partitions)
  for (const auto& [name, e] : experts) expert_numel += model->named_parameters()[name].numel();
  {
    at::NoGradGuard no_grad;
    for (auto& p : model->named_parameters())
      p.value().copy_(counterpart(ref_params, experts, p.key()));
  }
  dscpp::InitArgs args;
  args.group = world_ptr;
  auto eng = dscpp::initialize(model, ds_config(kMicro, c, c.stage), std::move(args));
  dscpp::zero::ZeroOptimizer* ez = eng.core().expert_zero_optimizer();
  check(ez != nullptr, where + "the engine found the experts", rank);
  if (!ez) return;
  check(eng.core().expert_data_group()->size() == d / c.ep,
        where + "the expert-data group has data / ep ranks", rank);
  check(ez->layout().total >= expert_numel && ez->layout().total < expert_numel + 64 * d,
        where + "the expert optimizer holds the experts (and only them)", rank);
  const bool compared = muon != "Muon";  // (see `muon`)

  const int dp_rank = rank;
  for (int step = 0; step < steps; ++step) {
    for (int m = 0; m < c.ga; ++m) {
      auto [x, y] = batch(step, m, kMicro * d);
      const at::Tensor mx = x.narrow(0, dp_rank * kMicro, kMicro);
      const at::Tensor my = y.narrow(0, dp_rank * kMicro, kMicro);
      at::Tensor ref_loss = c.dropless ? ref.forward(x, y) : ref.forward(mx, my);
      ref.backward(ref_loss);
      ref.step();
      at::Tensor loss = eng.forward(mx, my);
      eng.backward(loss);
      eng.step();
      double got = loss.item<double>();
      if (c.dropless) {
        at::Tensor mean = loss.detach().clone();
        world.all_reduce(mean).wait();
        got = mean.item<double>() / d;
      }
      if (compared)
        check_close(got, ref_loss.item<double>(), where + "step " + std::to_string(step) + " loss",
                    rank);
      check(std::isfinite(got), where + "a finite loss", rank);
    }
    const double n = eng.get_global_grad_norm(), n_ref = ref.get_global_grad_norm();
    if (compared)
      check_close(n, n_ref, where + "step " + std::to_string(step) + " grad norm", rank);
    if (step == 0) check(n_ref > 0.05, where + "the clip is active", rank);
  }
  if (!muon.empty()) {
    // The experts' partition steps by Muon, each stacked expert group orthogonalised once a
    // step in its expert-data group (by its owner), not by every rank that holds a piece; at
    // stage 0, where every rank holds every parameter and steps it, by each rank.
    auto* m = dynamic_cast<dscpp::optim::Muon*>(&ez->optimizer());
    check(m != nullptr, where + "the experts' partition steps by Muon", rank);
    if (!m) return;
    at::Tensor done = at::tensor({m->orthogonalised()}, at::kLong);
    eng.core().expert_data_group()->all_reduce(done).wait();
    const int64_t want = static_cast<int64_t>(ez->params().size()) * steps *
                         (c.stage == 0 ? eng.core().expert_data_group()->size() : 1);
    check(done.item<int64_t>() == want,
          where + "each expert group orthogonalised once a step in the expert-data group: " +
              std::to_string(done.item<int64_t>()) + " for " + std::to_string(want),
          rank);
  }
  // The weights (stage 3: the dense ones gathered by the engine's scope, the experts by theirs).
  std::vector<at::Tensor> dense;
  for (const auto& p : model->named_parameters())
    if (!experts.count(p.key())) dense.push_back(p.value());
  {
    auto gathered = eng.gathered_parameters(dense);
    ez->gather();
    if (compared)
      moe_test::check_weights(model->named_parameters(), ref_params, experts, where, rank);
    ez->release();
  }
}

// A wrong InitArgs::expert_data_group is refused by name, on every rank alike; with --muon, an
// expert's bias (the clones') too.
void refusals(const GroupPtr& world_ptr, const Groups& g) {
  const int rank = world_ptr->rank(), d = world_ptr->size();
  Case c;
  if (!muon.empty()) {
    Case clones;
    clones.clones = true;
    Net biased(clones, 2, g.ep);
    dscpp::InitArgs args;
    args.group = world_ptr;
    try {
      auto eng = dscpp::initialize(biased, ds_config(kMicro, clones, 1), std::move(args));
      check(false, "Muon with an expert's bias at ep_size 2 was accepted", rank);
    } catch (const dscpp::Error& e) {
      check(std::string(e.what()).find(".bias', which Muon would not step") != std::string::npos,
            std::string("the refusal names the expert's bias: ") + e.what(), rank);
    }
  }
  Net model(c, 2, g.ep);
  dscpp::InitArgs args;
  args.group = world_ptr;
  args.expert_data_group = world_ptr;
  try {
    auto eng = dscpp::initialize(model, ds_config(kMicro, c, 1), std::move(args));
    check(false, "an expert-data group of the whole world was accepted", rank);
  } catch (const dscpp::Error& e) {
    const std::string want = "InitArgs::expert_data_group has " + std::to_string(d) + " ranks";
    check(std::string(e.what()).find(want) != std::string::npos,
          std::string("the refusal names the group's size: ") + e.what(), rank);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 20;
  bool refuse = false;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--refusals") refuse = true;
    if (i + 1 >= argc) continue;
    if (flag == "--steps") steps = std::stoi(argv[i + 1]);
    if (flag == "--muon") muon = argv[i + 1];
    if (flag == "--case")
      cases.push_back(moe_test::parse_case(argv[i + 1], "ekdszcg", "moe_engine"));
  }
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  if (cases.empty() && !refuse) {
    std::cerr << "moe_engine: no --case given\n";
    return 2;
  }
  try {
    // Every rank makes every group in the same order, whichever it uses.
    std::map<int, Groups> groups;
    dscpp::comm::Topology topo({"data", "model"}, {world->size(), 1});
    for (int ep = 2; ep <= world->size(); ep *= 2) {
      if (world->size() % ep != 0) continue;
      groups[ep].ep = dscpp::comm::new_expert_groups(*world, topo, ep).expert_parallel;
    }
    GroupPtr self;
    for (int r = 0; r < world->size(); ++r)
      if (auto sub = world->new_subgroup({r})) self = sub;
    for (auto& [ep, g] : groups) g.self = self;
    for (const Case& c : cases) {
      if (!groups.count(c.ep)) throw dscpp::Error("moe_engine: no ep " + std::to_string(c.ep));
      run_case(*world, world, groups.at(c.ep), c, steps);
    }
    if (refuse) refusals(world, groups.at(2));
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return moe_test::failures == 0 ? 0 : 1;
}
