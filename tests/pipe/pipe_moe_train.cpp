// Trains a tiny MoE GPT (model_zoo's gpt_layer_specs: hidden 16, 4 blocks each MoE of 4 experts
// top-2 of FFN 16 plus a shared expert, dropless, tied head) on a pipeline of the launcher's
// ranks, for pipe_moe_checkpoint_oracle.py and pipe_tp_moe_checkpoint_oracle.py (a tensor degree):
//   pipe_moe_train --stages P [--tensor T] --ep E --zero Z --steps N --out OUT.json
//                  [--load DIR [--universal]] [--save DIR --save-at S] [--weights PREFIX]
// The ranks form P stages x (world / (P T)) data ranks x T tensor ranks, the expert-parallel
// groups of E inside each stage and tensor rank's data group (comm::new_expert_groups on the
// pipe x data x model topology); at T > 1 the GPT is tensor_parallel_gpt_layer_specs on the
// model group, its loss tensor_parallel_gpt_loss. Layers are seeded per layer (seed_layers:
// experts by global id), so every layout starts from the same model;
// each step is one global batch of 8 sequences in 2 micro-batches per data rank's share.
// Rank 0 writes {"first_step", "losses"}; --weights: every rank writes PREFIX.rank<r>, a torch
// file {"stage", "data", "model", "ep", "params": its stage module's trained parameters, fp32,
// local names (a tensor rank's shards)}, from which the oracle puts the one-rank model together
// itself (at T 1) or compares rank by rank.
#include <torch/torch.h>

#include <boost/program_options.hpp>
#include <fstream>
#include <iostream>

#include "dscpp/comm/expert_groups.h"
#include "dscpp/comm/rendezvous.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"
#include "dscpp/pipe/pipeline_engine.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace po = boost::program_options;
using dscpp::checkpoint::PyValue;
using nlohmann::json;

namespace {

constexpr int64_t kGlobalBatch = 8, kMicroBatches = 2, kSeq = 8, kVocab = 32;

dscpp::model_zoo::GPTConfig moe_gpt(int64_t ep, int64_t t) {
  return dscpp::model_zoo::GPTConfig::from_json(
      {{"model",
        {{"hidden_size", 16},
         {"num_layers", 4},
         {"num_attention_heads", 2},
         {"seq_length", kSeq},
         {"vocab_size", kVocab},
         {"hidden_dropout", 0.0},
         {"attention_dropout", 0.0},
         {"bias_gelu_fusion", false},
         {"cross_entropy_loss_fusion", false},
         {"gelu_approximation", "none"},
         {"num_experts", 4},
         {"moe_router_topk", 2},
         {"moe_ffn_hidden_size", 16},
         {"moe_shared_expert_intermediate_size", 16}}},
       {"parallelism", {{"expert_model_parallel_size", ep}, {"tensor_model_parallel_size", t}}}});
}

// Sequences [first, first + count) of a deterministic token data set, next-token targets.
std::pair<at::Tensor, at::Tensor> samples(int64_t first, int64_t count) {
  auto i = torch::arange(first, first + count, torch::kLong).unsqueeze(1);
  auto j = torch::arange(kSeq + 1, torch::kLong);
  auto tokens = (i * 7 + j * 3 + (i * j) % 5) % kVocab;
  return {tokens.narrow(1, 0, kSeq).contiguous(), tokens.narrow(1, 1, kSeq).contiguous()};
}

}  // namespace

int main(int argc, char** argv) {
  std::string load, save, out_path, weights;
  int stages = 2, tensor = 1, zero = 1, steps = 0, save_at = -1;
  bool universal = false;
  int64_t ep = 1;
  po::options_description desc("pipe_moe_train");
  desc.add_options()("stages", po::value(&stages), "pipeline stages")("tensor", po::value(&tensor),
                                                                      "tensor-parallel degree")(
      "ep", po::value(&ep), "expert_model_parallel_size")("zero", po::value(&zero), "ZeRO stage")(
      "steps", po::value(&steps)->required(), "optimizer steps in all")(
      "load", po::value(&load), "load this folder's latest first")(
      "universal", po::bool_switch(&universal), "load its latest_universal (to_universal's)")(
      "save", po::value(&save), "save into this folder")("save-at", po::value(&save_at),
                                                         "after this many steps")(
      "out", po::value(&out_path)->required(), "rank 0's JSON")(
      "weights", po::value(&weights), "every rank's stage parameters: PREFIX.rank<r>")(
      "local_rank", po::value<int>(), "the launcher's (ranks read the environment)");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  try {
    auto world = dscpp::comm::init_distributed();
    const int n = world->size(), data = n / (stages * tensor);
    const auto topo = dscpp::pipe::pipe_model_data_topology(stages, tensor, data);
    // The groups first (the tensor-parallel layers need the model group), then the experts'.
    const auto groups = dscpp::pipe::make_parallel_groups(world, topo);
    std::shared_ptr<dscpp::comm::ProcessGroup> ep_group;
    if (ep > 1)
      ep_group = dscpp::comm::new_expert_groups(*world, topo, static_cast<int>(ep)).expert_parallel;
    const auto model_group = groups->model;
    auto options = dscpp::pipe::PipelineOptions(stages)
                       .groups(groups)
                       .partition_method("uniform")
                       .seed_layers(true)
                       .base_seed(1234)
                       .loss_fn(dscpp::pipe::loss_of(
                           [tensor, model_group](const at::Tensor& o, const at::Tensor& y) {
                             if (tensor > 1)
                               return dscpp::model_zoo::tensor_parallel_gpt_loss(o, y, model_group);
                             return dscpp::model_zoo::gpt_loss(o, y, /*fused=*/false);
                           }));
    dscpp::pipe::PipelineModule module(
        tensor > 1 ? dscpp::model_zoo::tensor_parallel_gpt_layer_specs(moe_gpt(ep, tensor),
                                                                       model_group, ep_group)
                   : dscpp::model_zoo::gpt_layer_specs(moe_gpt(ep, 1), ep_group),
        options);
    json cfg = {
        {"train_batch_size", kGlobalBatch},
        {"gradient_accumulation_steps", kMicroBatches},
        {"gradient_clipping", 1.0},
        // eps 1e-4, as the pipeline GPT oracle's: gradients near Adam's eps would turn
        // the last bits of another layout's sums into steps.
        {"optimizer",
         {{"type", "AdamW"}, {"params", {{"lr", 1e-2}, {"eps", 1e-4}, {"weight_decay", 0.01}}}}},
        {"zero_optimization", {{"stage", zero}}},
        {"steps_per_print", 0}};
    if (universal) cfg["checkpoint"] = {{"load_universal", true}};
    auto engine = dscpp::initialize(module, cfg);
    const int64_t mb = engine.train_micro_batch_size_per_gpu();
    const int d = engine.module().data_parallel_id();
    json result;
    if (!load.empty()) (void)engine.load_checkpoint(load);
    const int first = static_cast<int>(engine.global_steps());
    result["first_step"] = first;
    result["losses"] = json::array();
    for (int s = first; s < steps; ++s) {
      int64_t j = 0;
      dscpp::pipe::DataIter it = [&]() {
        auto [x, y] = samples(s * kGlobalBatch + (j++ * data + d) * mb, mb);
        return dscpp::pipe::MicroBatch{{x}, y};
      };
      result["losses"].push_back(engine.train_batch(it).item<double>());
      if (s + 1 == save_at) engine.save_checkpoint(save);
    }
    if (!weights.empty()) {
      PyValue params = PyValue::ordered_dict();
      // What trains: the last stage's copy of the tied embedding keeps a frozen, unused
      // position embedding (a load gives it the first stage's values, the run its own).
      for (const auto& p : engine.module().stage_module()->named_parameters())
        if (p.value().requires_grad())
          params.set(PyValue(p.key()), PyValue(p.value().detach().to(torch::kFloat).clone()));
      PyValue file = PyValue::dict();
      file.set(PyValue("stage"), PyValue(engine.stage_id()));
      file.set(PyValue("data"), PyValue(d));
      file.set(PyValue("model"), PyValue(engine.module().model_parallel_id()));
      file.set(PyValue("ep"), PyValue(ep));
      file.set(PyValue("params"), std::move(params));
      dscpp::checkpoint::save_torch_file(file, weights + ".rank" + std::to_string(world->rank()));
    }
    if (world->rank() == 0) std::ofstream(out_path) << result.dump() << "\n";
    world->barrier().wait();
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "pipe_moe_train: " << e.what() << "\n";
    return 1;
  }
}
