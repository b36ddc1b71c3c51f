// What pipe_train's modes share: the tiny LayerSpec models (an MLP of 8 layers, the same with a
// tuple activation and an auxiliary loss, model_zoo's tiny GPT, and "gpt3d", the GPT of the 3D
// tests, whole or tensor-parallel), their deterministic data, losses and optimizer settings, and
// the JSON a rank writes.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/comm/process_group.h"
#include "dscpp/model_zoo/gpt_config.h"
#include "dscpp/nn/layer_spec.h"

namespace pipe_test {

using dscpp::nn::LayerSpec;
using nlohmann::json;
using GroupPtr = std::shared_ptr<dscpp::comm::ProcessGroup>;

constexpr int64_t kGlobalBatch = 16;
constexpr int64_t kBaseSeed = 1234;

// An MLP of 8 layers, 16 -> 32 x 6 -> 4, GELU/tanh between.
std::vector<LayerSpec> mlp_specs();
// The MLP's shape with a tuple activation (hidden, mask) and an auxiliary loss from layer 3.
std::vector<LayerSpec> tuple_specs();
// model_zoo's tiny GPT (vocabulary 32, hidden 16, 6 layers, sequence 8, no dropout).
dscpp::model_zoo::GPTConfig gpt_config();
// The 3D tests' GPT (hidden 64, 4 heads, 4 layers) at tensor degree t.
dscpp::model_zoo::GPTConfig gpt3d_config(int t = 1, bool sp = false, bool checkpointed = false);
// "mlp", "tuple", "gpt" or "gpt3d"; model_group: the tensor-parallel group of a "gpt3d" case
// (null: the one-rank GPT); c: the case (its "sp" and "checkpoint_activations").
std::vector<LayerSpec> specs_of(const std::string& model, const GroupPtr& model_group = nullptr,
                                const json& c = json::object());
at::Tensor loss_of(const std::string& model, const at::Tensor& out, const at::Tensor& labels,
                   const GroupPtr& model_group = nullptr);
// Samples [first, first + count) of the model's data set: deterministic.
std::pair<at::Tensor, at::Tensor> samples(const std::string& model, int64_t first, int64_t count);
json optimizer_config(const std::string& model);
std::vector<double> flat(const at::Tensor& t);
void write(const std::string& path, const json& j);

}  // namespace pipe_test
