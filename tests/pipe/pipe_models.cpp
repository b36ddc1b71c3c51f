// The pipeline test programs' shared models, data and settings: see pipe_models.h.
#include "tests/pipe/pipe_models.h"

#include <torch/torch.h>

#include <fstream>

#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel_specs.h"
#include "dscpp/nn/aux_loss.h"

namespace pipe_test {

// An MLP of 8 layers, 16 -> 32 x 6 -> 4, GELU/tanh between.
std::vector<LayerSpec> mlp_specs() {
  std::vector<LayerSpec> specs;
  const std::vector<int64_t> widths = {16, 32, 32, 32, 32, 32, 32, 32, 4};
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int64_t in = widths[i], out = widths[i + 1];
    const bool last = i + 2 == widths.size();
    specs.push_back({"layers." + std::to_string(i),
                     [in, out] { return torch::nn::Linear(in, out).ptr(); },
                     [last, i](torch::nn::Module& m, const at::Tensor& x) {
                       at::Tensor y = static_cast<torch::nn::LinearImpl&>(m).forward(x);
                       if (last) return y;
                       return i % 2 == 0 ? torch::gelu(y) : torch::tanh(y);
                     },
                     "",
                     {}});
  }
  return specs;
}

// The MLP's shape with a tuple activation: (hidden, mask), the mask a float tensor without
// gradient that every layer reads, and an auxiliary loss added by layer 3 (the side channel).
std::vector<LayerSpec> tuple_specs() {
  std::vector<LayerSpec> specs;
  const std::vector<int64_t> widths = {16, 32, 32, 32, 32, 32, 32, 32, 4};
  using dscpp::nn::Activation;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    const int64_t in = widths[i], out = widths[i + 1];
    LayerSpec spec{"layers." + std::to_string(i),
                   [in, out] { return torch::nn::Linear(in, out).ptr(); },
                   nullptr,
                   "",
                   {}};
    spec.forward_tuple = [i, last = i + 2 == widths.size()](torch::nn::Module& m,
                                                            const Activation& a) {
      auto& linear = static_cast<torch::nn::LinearImpl&>(m);
      if (i == 0) {
        at::Tensor h = torch::gelu(linear.forward(a.at(0)));
        return Activation{h, (h.detach() > 0.1).to(torch::kFloat)};
      }
      if (last) return Activation{linear.forward(a.at(0))};
      at::Tensor h = torch::tanh(linear.forward(a.at(0))) * (0.5 + 0.5 * a.at(1));
      if (i == 3) dscpp::nn::add_aux_loss(0.05 * h.pow(2).mean());
      return Activation{h, a.at(1)};
    };
    specs.push_back(std::move(spec));
  }
  return specs;
}

dscpp::model_zoo::GPTConfig gpt_config() {
  dscpp::model_zoo::GPTConfig c;
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_layers = 6;  // 9 specs: embedding, 6 blocks, final norm, tied head
  c.num_attention_heads = 2;
  c.seq_length = 8;
  c.hidden_dropout = c.attention_dropout = 0.0;
  return c;
}

// "gpt3d": the tiny GPT of the 3D tests (hidden 64, 4 heads, 4 layers), whole on one
// rank or tensor-parallel over a model group.
// A case's "sp" and "checkpoint_activations" turn on sequence parallelism and per-block
// activation checkpointing (the same numbers: the reference has neither).
dscpp::model_zoo::GPTConfig gpt3d_config(int t, bool sp, bool checkpointed) {
  dscpp::model_zoo::GPTConfig c = gpt_config();
  c.vocab_size = 64;
  c.hidden_size = 64;
  c.num_layers = 4;
  c.num_attention_heads = 4;
  c.parallelism.tensor_model_parallel_size = t;
  c.parallelism.sequence_parallel = sp;
  c.checkpoint_activations = checkpointed;
  return c;
}

// model_group: the tensor-parallel group of a "gpt3d" case (null: the one-rank GPT); c: the
// case (its "sp" and "checkpoint_activations").
std::vector<LayerSpec> specs_of(const std::string& model, const GroupPtr& model_group,
                                const json& c) {
  if (model == "mlp") return mlp_specs();
  if (model == "tuple") return tuple_specs();
  if (model == "gpt3d") {
    const bool sp = c.value("sp", false), checkpointed = c.value("checkpoint_activations", false);
    if (!model_group)
      return dscpp::model_zoo::gpt_layer_specs(gpt3d_config(1, false, checkpointed));
    return dscpp::model_zoo::tensor_parallel_gpt_layer_specs(
        gpt3d_config(model_group->size(), sp, checkpointed), model_group);
  }
  return dscpp::model_zoo::gpt_layer_specs(gpt_config());
}

at::Tensor loss_of(const std::string& model, const at::Tensor& out, const at::Tensor& labels,
                   const GroupPtr& model_group) {
  if (model != "gpt" && model != "gpt3d") return torch::mse_loss(out, labels);
  if (model_group) return dscpp::model_zoo::tensor_parallel_gpt_loss(out, labels, model_group);
  return dscpp::model_zoo::gpt_loss(out, labels, /*fused=*/false);
}

// Samples [first, first + count) of the model's data set: deterministic.
std::pair<at::Tensor, at::Tensor> samples(const std::string& model, int64_t first, int64_t count) {
  if (model != "gpt" && model != "gpt3d") {
    auto i = torch::arange(first, first + count, torch::kFloat).unsqueeze(1);
    auto x = torch::sin(i * 0.37 + torch::arange(16, torch::kFloat) * 0.11);
    auto y = torch::cos(i * 0.21 + torch::arange(4, torch::kFloat) * 0.5);
    return {x, y};
  }
  auto i = torch::arange(first, first + count, torch::kLong).unsqueeze(1);
  auto j = torch::arange(8, torch::kLong);
  auto tokens = (i * 7 + j * 3 + (i * j) % 5) % 32;  // < every GPT's vocabulary
  return {tokens, (tokens * 5 + 1) % 32};
}

json optimizer_config(const std::string& model) {
  // The tensor-parallel GPT: SGD with momentum, as tp_engine's oracle. Some gradients are zero
  // in exact arithmetic (the key bias's: softmax ignores it) and a few ulps apart across
  // layouts (the shards' partial sums add in another order); Adam would turn that noise into
  // steps of lr.
  if (model == "gpt3d") return {{"type", "SGD"}, {"params", {{"lr", 0.03}, {"momentum", 0.9}}}};
  // As the engine's oracle: the GPT's gradients near Adam's eps amplify 1-ulp differences,
  // so its runs use eps 1e-4.
  return {{"type", "AdamW"},
          {"params",
           {{"lr", 1e-2},
            {"betas", {0.9, 0.999}},
            {"eps", model == "mlp" || model == "tuple" ? 1e-8 : 1e-4},
            {"weight_decay", 0.01}}}};
}

std::vector<double> flat(const at::Tensor& t) {
  auto d = t.detach().to(torch::kCPU, torch::kDouble).flatten().contiguous();
  return {d.data_ptr<double>(), d.data_ptr<double>() + d.numel()};
}

void write(const std::string& path, const json& j) {
  std::ofstream(path) << j.dump();
}

}  // namespace pipe_test
