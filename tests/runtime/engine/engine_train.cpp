// Trains a tiny model for the single-rank oracle. --mode reference: plain LibTorch (no
// dscpp), one process, the whole global batch per step, torch::optim::AdamW and
// clip_grad_norm_. --mode dscpp: dscpp::initialize over the same model and data, run by the
// launcher on N ranks, each taking its micro-batches of the same global batch. Rank 0 writes
// {"losses": [...], "params": [...], "state_numel": n, "partition": n} as JSON to --out.
#include <torch/torch.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/nn/layer_module.h"
#include "dscpp/optim/muon.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/gathered_parameters.h"
#include "dscpp/zero/layer_gather.h"
#include "dscpp/zero/zero_optimizer.h"

namespace po = boost::program_options;
using nlohmann::json;

namespace {

struct MlpImpl : torch::nn::Module {
  MlpImpl() {
    l1 = register_module("l1", torch::nn::Linear(16, 32));
    l2 = register_module("l2", torch::nn::Linear(32, 32));
    l3 = register_module("l3", torch::nn::Linear(32, 4));
  }
  torch::Tensor forward(torch::Tensor x) { return l3(torch::tanh(l2(torch::gelu(l1(x))))); }
  torch::nn::Linear l1{nullptr}, l2{nullptr}, l3{nullptr};
};
TORCH_MODULE(Mlp);

// A small transformer: token embedding, one pre-built encoder layer (2 heads, GELU, no
// dropout), and a head over the 32-token vocabulary; predicts a function of each token.
// GELU rather than ReLU: ReLU's exact zeros leave gradients that are zero in one summation
// order and 1e-12 in another, which Adam's normalisation turns into lr-sized differences.
struct TinyTransformerImpl : torch::nn::Module {
  TinyTransformerImpl() {
    embed = register_module("embed", torch::nn::Embedding(32, 16));
    layer = register_module(
        "layer", torch::nn::TransformerEncoderLayer(torch::nn::TransformerEncoderLayerOptions(16, 2)
                                                        .dim_feedforward(32)
                                                        .dropout(0.0)
                                                        .activation(torch::kGELU)));
    head = register_module("head", torch::nn::Linear(16, 32));
  }
  torch::Tensor forward(torch::Tensor tokens) {
    // [batch, seq] -> [seq, batch, 16] as the encoder layer expects, and back.
    auto h = layer->forward(embed(tokens).transpose(0, 1)).transpose(0, 1);
    return head(h);
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::TransformerEncoderLayer layer{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(TinyTransformer);

// model_zoo's GPT as LayerSpecs (embedding, 2 blocks, final norm, tied head), so that ZeRO
// stage 3 gathers it layer by layer; the same 32-token task as the transformer's.
dscpp::nn::LayerModule tiny_gpt() {
  dscpp::model_zoo::GPTConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_layers = 2;
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return dscpp::nn::LayerModule(dscpp::model_zoo::gpt_layer_specs(c));
}

// Token sequences of length 8 and their targets, deterministic like samples().
std::pair<torch::Tensor, torch::Tensor> token_samples(int64_t first, int64_t count) {
  auto i = torch::arange(first, first + count, torch::kLong).unsqueeze(1);
  auto j = torch::arange(8, torch::kLong);
  auto tokens = (i * 7 + j * 3 + (i * j) % 5) % 32;
  return {tokens, (tokens * 5 + 1) % 32};
}

// Sample i of the data set: deterministic, so every process builds the same batches.
std::pair<torch::Tensor, torch::Tensor> samples(int64_t first, int64_t count) {
  auto i = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
  auto x = torch::sin(i * 0.37 + torch::arange(16, torch::kFloat) * 0.11);
  auto y = torch::cos(i * 0.21 + torch::arange(4, torch::kFloat) * 0.5);
  return {x, y};
}

std::vector<double> flat_params(torch::nn::Module& m) {
  std::vector<double> out;
  for (const auto& p : m.parameters()) {
    auto t = p.detach().to(torch::kCPU, torch::kDouble).flatten().contiguous();
    out.insert(out.end(), t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  return out;
}

}  // namespace

// Checkpointing around dscpp training: load from `load` first (its latest tag), save to
// `save` after optimizer step `save_at` with a client_state that records that step.
struct CheckpointArgs {
  std::string save, load;
  int save_at = -1;
  int save_interval = 0;  // also save after every this many steps (0: never)
  // With "type": "Muon": parameters given to the auxiliary Adam (InitArgs::use_muon false).
  std::vector<std::string> adam_params;
  // Parameter groups (InitArgs::param_groups): [{"params": [names], "lr": ..., ...}, ...].
  std::string groups;
};

// Trains with dscpp; returns rank 0's result, null on other ranks.
template <typename Holder, typename LossOf>
json train_dscpp(Holder& model, const json& cfg, int steps, LossOf& loss_of,
                 const CheckpointArgs& ckpt) {
  json result;
  const int64_t global_batch = cfg["train_batch_size"].get<int64_t>();
  dscpp::InitArgs init;
  for (const auto& name : ckpt.adam_params) init.use_muon[name] = false;
  if (!ckpt.groups.empty())
    for (const auto& g : json::parse(ckpt.groups)) {
      dscpp::ParamGroup group;
      group.params = g.at("params").get<std::vector<std::string>>();
      for (const auto& [key, value] : g.items())
        if (key != "params") group.options[key] = value;
      init.param_groups.push_back(std::move(group));
    }
  auto engine = dscpp::initialize(model, cfg, init);
  const int n = engine.world_size(), r = engine.global_rank();
  const int64_t mb = engine.train_micro_batch_size_per_gpu();
  const int64_t ga = engine.gradient_accumulation_steps();
  auto forward = [&](torch::Tensor in) { return engine.forward(in); };
  int first = 0;
  if (!ckpt.load.empty()) {
    auto loaded = engine.load_checkpoint(ckpt.load);
    first = static_cast<int>(engine.global_steps());
    result["client_state"] = loaded.client_state.to_json();
  }
  result["first_step"] = first;
  result["losses"] = json::array();
  result["grad_norms"] = json::array();
  bool deferred = false;  // a step left all-gathers for the next forward (deferred all-gather)
  for (int s = first; s < steps; ++s) {
    double loss_sum = 0;
    for (int64_t m = 0; m < ga; ++m) {
      auto loss = loss_of(forward, s * global_batch + (m * n + r) * mb, mb, engine.device());
      engine.backward(loss);
      engine.step();
      deferred |= engine.core().zero_optimizer().publish_pending();
      loss_sum += loss.template item<double>();
    }
    // The global batch's loss: the mean of every rank's micro-batch losses.
    auto l = torch::tensor({loss_sum / ga}, torch::kFloat64).to(engine.device());
    engine.core().group().all_reduce(l, dscpp::comm::ReduceOp::kAvg).wait();
    result["losses"].push_back(l.cpu().template item<double>());
    result["grad_norms"].push_back(engine.get_global_grad_norm());
    if (s + 1 == ckpt.save_at || (ckpt.save_interval > 0 && (s + 1) % ckpt.save_interval == 0)) {
      auto client = dscpp::checkpoint::PyValue::dict();
      client.set("saved_at", s + 1);
      client.set("note", "from engine_train");
      engine.save_checkpoint(ckpt.save, "", client);
    }
  }
  auto& zo = engine.core().zero_optimizer();
  result["publish_deferred"] = deferred;
  // Stage 3 by layer: the most elements gathered at once during training, and the bound.
  if (auto* gather = engine.core().layer_gather()) {
    result["peak_live"] = zo.peak_live_numel();
    result["max_layer"] = gather->max_layer_numel();
    result["gathers"] = zo.gathers();
  }
  // At stage 3 the parameters are empty at rest: what they hold now, then their full values.
  result["params_at_rest"] = zo.params_numel_held();
  result["partition16"] = zo.partition16_numel();
  // Parameter offload: where the 16-bit partition lives, and its staging buffers' use.
  result["partition16_device"] = zo.param_store().partition16_device().str();
  result["staged_gathers"] = zo.param_store().staged_gathers();
  result["staging_buffers"] = zo.param_store().staging_buffers();
  // Parameter NVMe offload: the swap folder, its files' sizes, what stays in memory (the
  // swapper's own accounting), and its reads (ahead of their gathers) and writes.
  if (auto* ps = zo.param_store().swapper()) {
    result["param_nvme_folder"] = ps->folder();
    result["param_nvme_bytes"] = ps->bytes_on_disk();
    result["param_nvme_buffer_numel"] = ps->buffer_numel();
    result["param_nvme_peak_buffers"] = ps->peak_buffers_in_use();
    result["param_nvme_reads"] = ps->reads();
    result["param_nvme_reads_ahead_used"] = ps->reads_ahead_used();
    result["param_nvme_writes"] = ps->writes();
    result["param_resident"] = zo.param_store().resident16_numel();
    json files = json::object();
    for (const auto& e : std::filesystem::directory_iterator(ps->folder()))
      files[e.path().filename().string()] = std::filesystem::file_size(e.path());
    result["param_nvme_files"] = files;
  }
  {
    dscpp::zero::GatheredParameters gathered(zo);
    result["params"] = flat_params(*model);
  }
  result["state_numel"] = zo.optimizer().state_numel();
  // Muon: the Newton-Schulz runs of all ranks (each matrix once a step in the data group).
  for (const auto& p : engine.core().zero_partitions())
    if (const auto* muon = dynamic_cast<const dscpp::optim::Muon*>(&p.zero->optimizer())) {
      at::Tensor runs = at::tensor({static_cast<double>(muon->orthogonalised())}, at::kDouble);
      p.group->all_reduce(runs).wait();
      result["orthogonalised"] = runs.item<double>();
    }
  // ZeRO-Offload: where the master and the optimizer state live.
  result["offloaded"] = zo.offloaded();
  result["master_device"] = zo.master_partition().device().str();
  result["state_device"] = zo.optimizer().state(0).begin()->second.device().str();
  // NVMe offload: the swap folder, its files, and what stays in memory (the buffers).
  if (auto* swap = zo.master().swapper()) {
    result["nvme_folder"] = swap->folder();
    result["nvme_bytes"] = swap->bytes_on_disk();
    result["nvme_buffer_numel"] = swap->buffer_numel();
    json files = json::array();
    for (const auto& e : std::filesystem::directory_iterator(swap->folder()))
      files.push_back(e.path().filename().string());
    std::sort(files.begin(), files.end());
    result["nvme_files"] = files;
  }
  result["partition"] = zo.layout().partition;
  result["total"] = zo.layout().total;
  // ZeRO-Offload overlapped with backward: steps so, and bucket updates begun during backward.
  result["overlapped_steps"] = zo.overlapped_steps();
  result["updates_during_backward"] = zo.offload_updates_during_backward();
  return r == 0 ? result : json();
}

int train_main(int argc, char** argv) {
  std::string mode, config_text, out_path, model_name;
  int steps;
  CheckpointArgs ckpt;
  po::options_description desc("engine_train");
  desc.add_options()("mode", po::value(&mode)->required(), "init, reference or dscpp")(
      "config", po::value(&config_text)->default_value("{\"train_batch_size\": 1}"),
      "ds_config JSON text")("steps", po::value(&steps)->default_value(20), "optimizer steps")(
      "out", po::value(&out_path)->required(), "where rank 0 writes its JSON")(
      "model", po::value(&model_name)->default_value("mlp"),
      "mlp, transformer or gpt (LayerSpecs)")("local_rank", po::value<int>(),
                                              "set by the launcher")(
      "save", po::value(&ckpt.save), "dscpp mode: checkpoint folder to save to")(
      "save-at", po::value(&ckpt.save_at), "dscpp mode: save after this optimizer step")(
      "save-interval", po::value(&ckpt.save_interval), "dscpp mode: save every K steps")(
      "load", po::value(&ckpt.load), "dscpp mode: checkpoint folder to resume from")(
      "adam-param", po::value(&ckpt.adam_params)->composing(),
      "dscpp mode, Muon: a parameter the auxiliary Adam steps (repeatable)")(
      "groups", po::value(&ckpt.groups),
      "dscpp mode: parameter groups, JSON [{\"params\": [names], settings...}]");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  po::notify(vm);
  json cfg = json::parse(config_text);
  torch::manual_seed(1234);
  const bool gpt = model_name == "gpt";
  const bool transformer = model_name == "transformer" || gpt;
  Mlp mlp{nullptr};
  TinyTransformer tiny{nullptr};
  dscpp::nn::LayerModule layered{nullptr};
  if (gpt)
    layered = tiny_gpt();
  else if (transformer)
    tiny = TinyTransformer();
  else
    mlp = Mlp();
  torch::nn::Module& module = gpt           ? static_cast<torch::nn::Module&>(*layered)
                              : transformer ? static_cast<torch::nn::Module&>(*tiny)
                                            : static_cast<torch::nn::Module&>(*mlp);
  // Parameters that stay whole at stage 3, counted from the module for the at-rest assertion
  // by DeepSpeed's rule (mark_persistent_parameters): in registration order, each of at most
  // the persistence threshold's elements while the total stays within the model's threshold.
  int64_t small_numel = 0;
  const json zero_cfg = cfg.value("zero_optimization", json::object());
  const int64_t persist = zero_cfg.value("stage3_param_persistence_threshold", int64_t{100000});
  const int64_t persist_model =
      zero_cfg.value("stage3_model_persistence_threshold", std::numeric_limits<int64_t>::max());
  for (const auto& p : module.parameters())
    if (p.numel() <= persist && small_numel + p.numel() <= persist_model) small_numel += p.numel();
  // The loss of samples [first, first + count) on the module's device and in its type.
  auto loss_of = [&](auto&& forward, int64_t first, int64_t count, torch::Device device) {
    auto dtype = module.parameters()[0].scalar_type();
    if (transformer) {
      auto [tokens, target] = token_samples(first, count);
      auto logits = forward(tokens.to(device)).to(torch::kFloat);
      return torch::cross_entropy_loss(logits.reshape({-1, 32}), target.to(device).reshape({-1}));
    }
    auto [x, y] = samples(first, count);
    return torch::mse_loss(forward(x.to(device, dtype)).to(torch::kFloat), y.to(device));
  };
  json result;
  const int64_t global_batch = cfg["train_batch_size"].get<int64_t>();

  if (mode == "init") {
    // The initial weights by name, for an outside trainer (DeepSpeed) to start from.
    for (const auto& item : module.named_parameters()) {
      auto t = item.value().detach().to(torch::kDouble).contiguous();
      result[item.key()] = {
          {"shape", t.sizes().vec()},
          {"values", std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel())}};
    }
  } else if (mode == "reference") {
    auto p = cfg["optimizer"]["params"];
    torch::optim::AdamW opt(module.parameters(),
                            torch::optim::AdamWOptions(p["lr"].get<double>())
                                .betas({p["betas"][0], p["betas"][1]})
                                .eps(p["eps"].get<double>())
                                .weight_decay(p["weight_decay"].get<double>()));
    const double clip = cfg.value("gradient_clipping", 1.0);
    for (int s = 0; s < steps; ++s) {
      auto forward = [&](torch::Tensor in) {
        return gpt ? layered->forward(in) : transformer ? tiny->forward(in) : mlp->forward(in);
      };
      auto loss = loss_of(forward, s * global_batch, global_batch, torch::kCPU);
      opt.zero_grad();
      loss.backward();
      // The norm before clipping, as the engine reports it (infinity: measure, do not clip).
      result["grad_norms"].push_back(torch::nn::utils::clip_grad_norm_(
          module.parameters(), clip > 0 ? clip : std::numeric_limits<double>::infinity()));
      opt.step();
      result["losses"].push_back(loss.item<double>());
    }
    result["params"] = flat_params(module);
  } else if (gpt) {
    result = train_dscpp(layered, cfg, steps, loss_of, ckpt);
    if (result.is_null()) return 0;  // not rank 0
    result["small_numel"] = small_numel;
  } else if (transformer) {
    result = train_dscpp(tiny, cfg, steps, loss_of, ckpt);
    if (result.is_null()) return 0;  // not rank 0
  } else {
    result = train_dscpp(mlp, cfg, steps, loss_of, ckpt);
    if (result.is_null()) return 0;
  }
  std::ofstream(out_path) << result.dump() << "\n";
  return 0;
}

// A library error (a bad config value, an nvme_path that is not a folder, ...) ends the run
// with its message and exit status 1, as a program using dscpp would, not with an abort.
int main(int argc, char** argv) {
  try {
    return train_main(argc, argv);
  } catch (const dscpp::Error& e) {
    std::cerr << "engine_train: " << e.what() << "\n";
    return 1;
  }
}
