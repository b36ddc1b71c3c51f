// Experts with tensor parallelism, on real Gloo ranks: model_zoo's TensorParallelGPT
// with MoE blocks (hidden 64, 2 layers both MoE, 4 experts of FFN 32, GPT-2's blocks) at tensor
// t x data d with expert degree E (the expert-parallel groups formed among the data ranks of one
// tensor rank; each tensor rank dispatching 1/t of the tokens) trains, fp32, like model_zoo's GPT
// at t 1 and ep 1, within 1e-5 relative: every micro-step's loss, every step's gradient norm
// (gradient_clipping active: an expert counted t times, or a partial expert gradient left
// unsummed over the tensor group, changes the weights), and after the steps every weight
// against its slice of the reference's (the tensor slice of a split parameter, the expert-parallel
// rank's experts of a routed expert; the experts must also be equal on every tensor rank).
//   - dropless: against one rank with the same global batch (each rank also runs that one-rank
//     engine on a group of itself); the loss carries no l_aux (it is each rank's own).
//   - token dropping (capacity factor 0.5, 0.01 l_aux in the loss): against the GPT at t 1,
//     ep 1 on this tensor rank's data group (capacity and l_aux are per data rank): so also
//     E = 1 at t 2 (DeepSpeed's "dropping = tensor 2 ep 1") is the same model.
//   - suffix a (dropless, with every balancing term: the sigmoid router's aux loss, z-loss and
//     expert bias, the bias moved after each step from the data group's counts): against the
//     GPT at t 1, ep 1 on the data group as well (the losses are per data rank); the biases too.
//   - suffix p: with sequence parallelism (each tensor rank routing its own sequence shard,
//     nn/moe/moe.h): the router's weights are marked partial too, and the loss compared is the
//     model's plus the aux losses summed over the tensor group (each rank's is its shard's
//     part, Megatron's). Only dropless: with a capacity the shard's own decides the drops
//     (tests/nn/moe_sp_layer.cpp compares that layer with the one-rank layer on each shard).
//   tp_moe_engine --tensor T --case e<E>k<k>d<dropless>s<shared>z<stage>g<ga>[p][a]
//                 [--case ...] [--steps N] [--refusals]
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>

#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/config/config_error.h"
#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/moe/router.h"
#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"
#include "dscpp/zero/zero_optimizer.h"
#include "tests/runtime/engine/tp_common.h"
#include "tests/runtime/engine/tp_moe_common.h"

using nlohmann::json;
using tp_test::check;
using tp_test::check_close;
namespace mz = dscpp::model_zoo;
namespace moe = dscpp::nn::moe;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

using namespace tp_moe_test;

namespace {

// The reference's tensor that the tensor-parallel MoE model's `name` holds on this rank: the
// expert-parallel rank's experts of a routed expert, the tensor slice of a split parameter.
at::Tensor counterpart(const std::map<std::string, at::Tensor>& ref,
                       const std::map<std::string, moe::ExpertParam>& experts,
                       const std::map<std::string, dscpp::nn::TensorParallelAttr>& attrs,
                       const std::string& name, int tp_rank, int t) {
  const at::Tensor& whole = ref.at(name);
  auto e = experts.find(name);
  if (e != experts.end() && e->second.ep_size > 1)
    return whole.narrow(0, e->second.ep_rank * e->second.num_local_experts,
                        e->second.num_local_experts);
  const auto& a = attrs.at(name);
  return a.tensor_model_parallel
             ? dscpp::nn::partition_of(whole, a.partition_dim, a.partition_stride, tp_rank, t)
             : whole;
}

void run_case(dscpp::comm::ProcessGroup& world, const tp_test::Groups& g,
              const std::map<int, GroupPtr>& ep_groups, const Case& c, int steps) {
  const int rank = world.rank(), t = g.t, d = g.d;
  // Against one rank with the global batch, or at t 1 on the data group where the loss is
  // per data rank (a capacity, or the aux losses).
  const bool one_rank = c.dropless && !c.aux;
  const std::string where = "case " + c.name + " t" + std::to_string(t) + "d" + std::to_string(d) +
                            (one_rank ? " (against one rank)" : " (against t1 ep1 on d ranks)") +
                            ": ";
  if (d % c.ep != 0) throw dscpp::Error(where + "ep must divide the data degree");
  if (c.sp && !c.dropless)
    throw dscpp::Error(where + "sequence parallelism is compared dropless only (see the top)");

  at::manual_seed(1);
  mz::GPT ref_model(moe_config(c, 1, 1));
  dscpp::InitArgs ref_args;
  ref_args.group = one_rank ? g.self : g.data;
  const int ref_micro = one_rank ? kMicro * d : kMicro;
  auto ref = dscpp::initialize(ref_model, ds_config(ref_micro, c, 0), std::move(ref_args));
  std::map<std::string, at::Tensor> ref_params;
  for (const auto& p : ref_model->named_parameters()) ref_params[p.key()] = p.value();

  at::manual_seed(1);
  mz::TensorParallelGPT model(moe_config(c, t, c.ep), g.model,
                              c.ep > 1 ? ep_groups.at(c.ep) : nullptr);
  const auto experts = moe::expert_parameters(*model);
  const auto attrs = dscpp::nn::tensor_parallel_attributes(*model);
  // The token split: every routed expert's gradient is a partial sum over the tensor group.
  int routed = 0, marked = 0;
  for (const auto& [name, e] : experts) {
    ++routed;
    marked += attrs.at(name).sequence_parallel && !attrs.at(name).tensor_model_parallel;
  }
  check(
      routed == 4 && marked == routed,
      where + "the routed experts (2 weights x 2 layers) are marked partial over the tensor group",
      rank);
  // The router sees the whole tokens (its gradient whole) or, with sequence parallelism, its
  // shard (partial).
  for (int layer = 0; layer < 2; ++layer) {
    const std::string wg = "blocks." + std::to_string(layer) + ".mlp.deepspeed_moe.gate.wg.weight";
    check(attrs.at(wg).sequence_parallel == c.sp,
          where + wg + (c.sp ? " marked" : " not marked") + " sequence_parallel", rank);
  }
  // Started from the reference's weights (the same seed draws the same master weights).
  double start = 0;
  for (const auto& p : model->named_parameters())
    start = std::max(start, tp_test::rel_err(p.value(), counterpart(ref_params, experts, attrs,
                                                                    p.key(), g.tp_rank, t)));
  check(start == 0, where + "starts from the reference's weights: " + std::to_string(start), rank);

  dscpp::InitArgs args;
  args.group = g.data;
  args.model_group = g.model;
  auto eng = dscpp::initialize(model, ds_config(kMicro, c, c.stage), std::move(args));
  dscpp::zero::ZeroOptimizer* ez = eng.core().expert_zero_optimizer();
  check((ez != nullptr) == (c.ep > 1), where + "the engine holds the experts apart at ep > 1",
        rank);
  if (ez)
    check(eng.core().expert_data_group()->size() == d / c.ep,
          where + "the expert-data group has d / ep ranks (of this tensor rank)", rank);

  auto ref_loss_of = [&](const at::Tensor& logits, const at::Tensor& target) {
    return ref_model->loss(logits, target);
  };
  auto loss_of = [&](const at::Tensor& logits, const at::Tensor& target) {
    return model->loss(logits, target);
  };
  for (int step = 0; step < steps; ++step) {
    const at::Tensor tokens = tp_test::batch(step, int64_t{kMicro} * d * c.ga);
    for (int m = 0; m < c.ga; ++m) {
      const at::Tensor all = tokens.narrow(0, int64_t{m} * kMicro * d, kMicro * d);
      const at::Tensor mine = all.narrow(0, int64_t{g.dp_rank} * kMicro, kMicro);
      at::Tensor ref_loss = train_loss(ref, one_rank ? all : mine, ref_loss_of);
      ref.backward(ref_loss);
      ref.step();
      auto [model_loss, aux] = train_losses(eng, mine, loss_of);
      eng.backward(aux.defined() ? model_loss + aux : model_loss);
      eng.step();
      double got = model_loss.item<double>();
      if (aux.defined()) {
        // With sequence parallelism each tensor rank's aux losses are its shard's part.
        at::Tensor whole = aux.detach().clone();
        if (c.sp) g.model->all_reduce(whole).wait();
        got += whole.item<double>();
      }
      if (one_rank) {
        at::Tensor mean = at::scalar_tensor(got, at::kDouble);
        g.data->all_reduce(mean).wait();
        got = mean.item<double>() / d;
      }
      const double want = ref_loss.item<double>();
      check_close(got, want, where + "step " + std::to_string(step) + " loss", rank);
    }
    // The expert biases from the step's routing: the data group's counts (with sequence
    // parallelism each tensor rank's router counts its group's tokens).
    moe::update_expert_biases(*ref_model, one_rank ? g.self : g.data);
    moe::update_expert_biases(*model, g.data);
    const double n = eng.get_global_grad_norm(), n_ref = ref.get_global_grad_norm();
    check_close(n, n_ref, where + "step " + std::to_string(step) + " grad norm", rank);
    if (step == 0) check(n_ref > 0.5, where + "the clip is active (norm > 0.5)", rank);
  }
  // The weights (stage 3: the dense ones gathered by the engine's scope, the experts by theirs),
  // and the routed experts equal over the tensor group (bit for bit: the same update).
  std::vector<at::Tensor> dense;
  for (const auto& p : model->named_parameters())
    if (!ez || !experts.count(p.key())) dense.push_back(p.value());
  double worst = 0, apart = 0;
  std::string worst_name;
  {
    auto gathered = eng.gathered_parameters(dense);
    if (ez) ez->gather();
    for (const auto& p : model->named_parameters()) {
      const double e = tp_test::rel_err(
          p.value(), counterpart(ref_params, experts, attrs, p.key(), g.tp_rank, t));
      if (e > worst) worst = e, worst_name = p.key();
      if (!experts.count(p.key())) continue;
      at::Tensor mine = p.value().detach().clone(), other = mine.clone();
      g.model->broadcast(other, 0).wait();
      apart = std::max(apart, (mine - other).abs().max().item<double>());
    }
    if (ez) ez->release();
  }
  check(worst <= 1e-5, where + "weights: worst " + worst_name + " " + std::to_string(worst), rank);
  if (c.aux) {
    // The expert biases moved, and alike (the same counts give the same signs).
    std::map<std::string, at::Tensor> ref_buffers;
    for (const auto& b : ref_model->named_buffers()) ref_buffers[b.key()] = b.value();
    int biases = 0;
    double moved = 0, bias_err = 0;
    for (const auto& b : model->named_buffers()) {
      if (b.key().find("expert_bias") == std::string::npos) continue;
      ++biases;
      moved = std::max(moved, b.value().abs().max().item<double>());
      bias_err =
          std::max(bias_err, (b.value() - ref_buffers.at(b.key())).abs().max().item<double>());
    }
    check(biases == 2 && moved > 0, where + "the expert biases moved", rank);
    check(bias_err == 0,
          where + "the expert biases equal the reference's: " + std::to_string(bias_err), rank);
  }
  check(apart == 0, where + "the experts equal on every tensor rank: " + std::to_string(apart),
        rank);
  if (rank == 0)
    std::cout << where << "done, worst weight error " << worst << " (" << worst_name << ")\n";
}

// What the tensor-parallel MoE GPT refuses, by name.
void refusals(const tp_test::Groups& g, const std::map<int, GroupPtr>& ep_groups) {
  const int rank = g.dp_rank * g.t + g.tp_rank;
  auto refused = [&](const std::string& what, const std::string& want, auto build) {
    try {
      build();
      check(false, what + ": accepted", rank);
    } catch (const dscpp::ConfigError& e) {
      check(std::string(e.what()).find(want) != std::string::npos,
            what + ": the refusal names " + want + ": " + e.what(), rank);
    }
  };
  Case c;
  mz::GPTConfig sp = moe_config(c, g.t, 2);
  sp.parallelism.sequence_parallel = true;
  refused("the LayerSpec form with experts and sequence parallelism",
          "parallelism.sequence_parallel",
          [&] { mz::tensor_parallel_gpt_layer_specs(sp, g.model, ep_groups.at(2)); });
  c.shared = true;
  mz::GPTConfig odd = moe_config(c, g.t, 2);
  odd.moe.moe_shared_expert_intermediate_size = 63;
  refused("a shared expert that does not split", "moe_shared_expert_intermediate_size",
          [&] { mz::TensorParallelGPT m(odd, g.model, ep_groups.at(2)); });
  // A micro-batch whose tokens do not split over the tensor group: a clear error, no hang.
  mz::TensorParallelGPT m(moe_config(c, g.t, 2), g.model, ep_groups.at(2));
  try {
    m->forward(at::zeros({1, 3}, at::kLong));
    check(false, "3 tokens split over 2 tensor ranks: accepted", rank);
  } catch (const dscpp::Error& e) {
    check(std::string(e.what()).find("divide by the tensor-parallel degree") != std::string::npos,
          std::string("the token split's refusal says why: ") + e.what(), rank);
  }
  // (Checkpoints of experts with tensor parallelism: tp_moe_checkpoint.cpp.)
}

}  // namespace

int main(int argc, char** argv) {
  int t = 2, steps = 20;
  bool refuse = false;
  std::vector<Case> cases;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--refusals") refuse = true;
    if (i + 1 >= argc) continue;
    const std::string value = argv[i + 1];
    if (flag == "--tensor") t = std::stoi(value);
    if (flag == "--steps") steps = std::stoi(value);
    if (flag == "--case") cases.push_back(parse_case(value));
  }
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  if (cases.empty() && !refuse) {
    std::cerr << "tp_moe_engine: no --case given\n";
    return 2;
  }
  try {
    // Every rank makes every group in the same order, whichever it uses.
    const auto g = tp_test::make_groups(*world, t);
    dscpp::comm::Topology topo({"pipe", "data", "model"}, {1, g.d, t});
    std::map<int, GroupPtr> ep_groups;
    for (int ep = 2; ep <= g.d; ep *= 2)
      if (g.d % ep == 0)
        ep_groups[ep] = dscpp::comm::new_expert_groups(*world, topo, ep).expert_parallel;
    for (const Case& c : cases) {
      if (c.ep > 1 && !ep_groups.count(c.ep))
        throw dscpp::Error("tp_moe_engine: no ep " + std::to_string(c.ep));
      run_case(*world, g, ep_groups, c, steps);
    }
    if (refuse) refusals(g, ep_groups);
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return tp_test::failures == 0 ? 0 : 1;
}
