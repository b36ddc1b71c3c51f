// Activation checkpointing of MoE blocks (nn/activation_checkpointing.h with model_zoo's MoE
// GPT), on 4 Gloo ranks: the MoE GPT (hidden 64, 2 blocks both MoE, 4 experts top-2 of FFN 32
// plus a shared expert, the sigmoid router with aux loss 0.01, z-loss 1e-3 and the expert bias
// at rate 0.01, dropout 0.1) with checkpoint_activations trains like the same GPT without it,
// fp32, 20 steps, SGD with momentum, clipping active: every step's loss and aux loss within
// 1e-6 relative, every weight within 1e-6 relative, the expert biases equal, and the routing
// counted once per forward: the routers' expert-bias counts and the MoE blocks' statistics
// (tokens per expert, forwards) equal the plain model's each step (a recompute that counted
// again would double them; the bias's sign update alone would not show it).
//   - engine: the GPT module on 4 data ranks at expert degree 1 and 2 (ZeRO 1 and 2);
//   - pipeline: gpt_layer_specs of 4 such blocks (each its own checkpointed segment; both
//     stages hold MoE blocks, which the routing check requires) on 2 stages x 2 data ranks at
//     expert degree 2 and 1, 2 micro-batches per batch (the aux losses reach the stage's
//     backward through the pipeline engine's scope).
// Each rank trains both models, reseeding before every forward so that both draw the same
// dropout masks.
//   moe_checkpointing [--steps N]
// Exits 0 when every check holds on this rank; prints what failed otherwise.
#include <ATen/ATen.h>

#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/router.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "tests/rank_checks.h"

using nlohmann::json;
using rank_checks::check, rank_checks::rel_err;
namespace mz = dscpp::model_zoo;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

namespace {

constexpr int64_t kMicro = 2, kSeq = 16, kVocab = 128;
int steps = 20;

mz::GPTConfig moe_gpt(int ep, bool checkpointed, int layers = 2) {
  return mz::GPTConfig::from_json({{"model",
                                    {{"hidden_size", 64},
                                     {"num_layers", layers},
                                     {"num_attention_heads", 4},
                                     {"seq_length", kSeq},
                                     {"vocab_size", kVocab},
                                     {"hidden_dropout", 0.1},
                                     {"attention_dropout", 0.1},
                                     {"gelu_approximation", "none"},
                                     {"num_experts", 4},
                                     {"moe_router_topk", 2},
                                     {"moe_ffn_hidden_size", 32},
                                     {"moe_shared_expert_intermediate_size", 32},
                                     {"moe_router_score_function", "sigmoid"},
                                     {"moe_aux_loss_coeff", 0.01},
                                     {"moe_z_loss_coeff", 0.001},
                                     {"moe_router_enable_expert_bias", true},
                                     {"moe_router_bias_update_rate", 0.01},
                                     {"checkpoint_activations", checkpointed}}},
                                   {"parallelism", {{"expert_model_parallel_size", ep}}}});
}

json ds_config(int64_t micro, int64_t ga, int stage) {
  return {{"train_micro_batch_size_per_gpu", micro},
          {"gradient_accumulation_steps", ga},
          {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.3}, {"momentum", 0.9}}}}},
          {"gradient_clipping", 0.5},
          {"zero_optimization", {{"stage", stage}, {"reduce_bucket_size", 20000}}},
          {"steps_per_print", 0}};
}

// Rows [first, first + count) of step `step`'s tokens: [count, seq + 1].
at::Tensor rows(int step, int64_t first, int64_t count, int64_t all) {
  at::Tensor t = at::randint(0, kVocab, {all, kSeq + 1}, at::detail::createCPUGenerator(500 + step),
                             at::kLong);
  return t.narrow(0, first, count);
}

// The routers' expert-bias counts and biases, the blocks' statistics, of a module.
struct Routing {
  std::vector<at::Tensor> counts, biases, stats;
  std::vector<int64_t> forwards;
};
Routing routing_of(torch::nn::Module& m) {
  Routing r;
  for (const auto& sub : m.modules())
    if (auto* gate = sub->as<dscpp::nn::moe::TopKGateImpl>()) {
      r.counts.push_back(gate->tokens_per_expert().clone());
      r.biases.push_back(gate->expert_bias.detach().clone());
    }
  for (auto& s : mz::take_moe_stats(m)) {
    r.stats.push_back(s.tokens_per_expert);
    r.forwards.push_back(s.forwards);
  }
  return r;
}

// Both undefined (no forward since the statistics were last taken), or equal.
bool same_or_both_unset(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() == b.defined() && (!a.defined() || at::equal(a, b));
}

void compare_routing(const Routing& a, const Routing& b, const std::string& where, int rank) {
  bool same = a.counts.size() == b.counts.size() && a.stats.size() == b.stats.size() &&
              !a.counts.empty() && a.forwards == b.forwards;
  for (size_t i = 0; same && i < a.counts.size(); ++i)
    same = same_or_both_unset(a.counts[i], b.counts[i]) &&
           same_or_both_unset(a.biases[i], b.biases[i]);
  for (size_t i = 0; same && i < a.stats.size(); ++i)
    same = same_or_both_unset(a.stats[i], b.stats[i]);
  check(same, where + "the routers' counts, the biases and the blocks' statistics equal", rank);
}

void compare_weights(torch::nn::Module& got, torch::nn::Module& want, const std::string& where,
                     int rank) {
  std::map<std::string, at::Tensor> ref;
  for (const auto& p : want.named_parameters()) ref[p.key()] = p.value();
  double worst = 0;
  std::string worst_name;
  for (const auto& p : got.named_parameters()) {
    const double e = rel_err(p.value(), ref.at(p.key()));
    if (e > worst) worst = e, worst_name = p.key();
  }
  check(!ref.empty() && worst <= 1e-6,
        where + "weights: worst " + worst_name + " " + std::to_string(worst), rank);
  if (rank == 0) std::cout << where << "done, worst weight error " << worst << "\n";
}

void check_close6(double got, double want, const std::string& what, int rank) {
  check(std::abs(got - want) <= 1e-6 * std::abs(want),
        what + " " + std::to_string(got) + " vs " + std::to_string(want), rank);
}

// The GPT module on the data world.
void engine_case(const GroupPtr& world, const std::map<int, GroupPtr>& ep_groups, int ep,
                 int stage) {
  const int rank = world->rank(), d = world->size();
  const std::string where =
      "engine ep " + std::to_string(ep) + " ZeRO " + std::to_string(stage) + ": ";
  const GroupPtr ep_group = ep > 1 ? ep_groups.at(ep) : nullptr;
  at::manual_seed(1);
  mz::GPT plain_model(moe_gpt(ep, false), ep_group);
  at::manual_seed(1);
  mz::GPT ckpt_model(moe_gpt(ep, true), ep_group);
  check(ckpt_model->activation_checkpointing_segments() == 2,
        where + "the MoE blocks are checkpointed", rank);
  auto plain = dscpp::initialize(plain_model, ds_config(kMicro, 1, stage));
  auto ckpt = dscpp::initialize(ckpt_model, ds_config(kMicro, 1, stage));
  auto train = [&](auto& eng, auto& model, int step) {
    const at::Tensor batch = rows(step, world->rank() * kMicro, kMicro, kMicro * d);
    at::manual_seed(77 + step);
    dscpp::nn::AuxLossScope aux;
    at::Tensor logits = eng.forward(batch.narrow(1, 0, kSeq));
    at::Tensor loss = model->loss(logits, batch.narrow(1, 1, kSeq));
    check(aux.sum().defined(), where + "the aux losses reached the scope", rank);
    eng.backward(loss + aux.sum());
    eng.step();
    return std::pair<double, double>{loss.item<double>(), aux.sum().item<double>()};
  };
  for (int step = 0; step < steps; ++step) {
    auto [loss_p, aux_p] = train(plain, plain_model, step);
    auto [loss_c, aux_c] = train(ckpt, ckpt_model, step);
    const std::string at_step = where + "step " + std::to_string(step) + " ";
    check_close6(loss_c, loss_p, at_step + "loss", rank);
    check_close6(aux_c, aux_p, at_step + "aux loss", rank);
    compare_routing(routing_of(*ckpt_model), routing_of(*plain_model), at_step, rank);
    dscpp::nn::moe::update_expert_biases(*plain_model, world);
    dscpp::nn::moe::update_expert_biases(*ckpt_model, world);
  }
  compare_weights(*ckpt_model, *plain_model, where, rank);
  compare_routing(routing_of(*ckpt_model), routing_of(*plain_model),
                  where + "after the steps: ", rank);
}

// gpt_layer_specs on 2 stages x 2 data ranks.
void pipeline_case(const GroupPtr& world, int ep) {
  const int rank = world->rank(), stages = 2, data = world->size() / stages;
  const std::string where = "pipeline 2 x 2 ep " + std::to_string(ep) + ": ";
  const auto topo = dscpp::pipe::pipe_model_data_topology(stages, 1, data);
  GroupPtr ep_group;
  if (ep > 1) ep_group = dscpp::comm::new_expert_groups(*world, topo, ep).expert_parallel;
  auto make = [&](bool checkpointed) {
    auto options = dscpp::pipe::PipelineOptions(stages)
                       .group(world)
                       .topology(topo)
                       .partition_method("uniform")
                       .seed_layers(true)
                       .base_seed(1234)
                       .loss_fn(dscpp::pipe::loss_of([](const at::Tensor& o, const at::Tensor& y) {
                         return mz::gpt_loss(o, y, /*fused=*/false);
                       }));
    dscpp::pipe::PipelineModule module(mz::gpt_layer_specs(moe_gpt(ep, checkpointed, 4), ep_group),
                                       options);
    return dscpp::initialize(module, ds_config(kMicro, 2, 1));
  };
  auto plain = make(false);
  auto ckpt = make(true);
  const int d = plain.module().data_parallel_id();
  auto train = [&](auto& eng, int step) {
    int64_t j = 0;
    dscpp::pipe::DataIter it = [&]() {
      const at::Tensor b = rows(step, (j++ * data + d) * kMicro, kMicro, kMicro * data * 2);
      return dscpp::pipe::MicroBatch{{b.narrow(1, 0, kSeq).contiguous()},
                                     b.narrow(1, 1, kSeq).contiguous()};
    };
    at::manual_seed(77 + step);
    const double loss = eng.train_batch(it).template item<double>();
    const at::Tensor aux = eng.last_aux_loss();
    return std::pair<double, double>{loss, aux.defined() ? aux.template item<double>() : 0.0};
  };
  auto& plain_stage = *plain.module().stage_module();
  auto& ckpt_stage = *ckpt.module().stage_module();
  for (int step = 0; step < steps; ++step) {
    auto [loss_p, aux_p] = train(plain, step);
    auto [loss_c, aux_c] = train(ckpt, step);
    const std::string at_step = where + "step " + std::to_string(step) + " ";
    check_close6(loss_c, loss_p, at_step + "loss", rank);
    check_close6(aux_c, aux_p, at_step + "aux loss", rank);
    compare_routing(routing_of(ckpt_stage), routing_of(plain_stage), at_step, rank);
    dscpp::nn::moe::update_expert_biases(plain_stage, plain.module().data_group());
    dscpp::nn::moe::update_expert_biases(ckpt_stage, ckpt.module().data_group());
  }
  compare_weights(ckpt_stage, plain_stage, where, rank);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--steps") steps = std::stoi(argv[i + 1]);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(120);
  auto world = dscpp::comm::init_distributed(options);
  try {
    const dscpp::comm::Topology topo({"pipe", "data", "model"}, {1, world->size(), 1});
    std::map<int, GroupPtr> ep_groups;
    ep_groups[2] = dscpp::comm::new_expert_groups(*world, topo, 2).expert_parallel;
    engine_case(world, ep_groups, 1, 1);
    engine_case(world, ep_groups, 2, 2);
    pipeline_case(world, 2);
    pipeline_case(world, 1);
  } catch (const std::exception& e) {
    std::cerr << "rank " << world->rank() << ": " << e.what() << "\n";
    return 1;
  }
  world->barrier().wait();
  return rank_checks::failures == 0 ? 0 : 1;
}
