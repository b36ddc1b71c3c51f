// For test_against_pytorch.py: builds a GPT from a config, runs one forward and backward on a
// random batch and writes what Python needs to recompute it to a .pt file (torch.load opens it):
// {"state": {name: weight}, "input_ids", "targets", "logits", "loss", "grads": {name: grad},
//  "num_parameters": the config's analytic count}.
// Usage: gpt_export '{"config": {...}, "batch": B, "seq": S, "seed": n, "train": bool}' out.pt
#include <ATen/Context.h>
#include <ATen/ops/randint.h>

#include <iostream>
#include <nlohmann/json.hpp>

#include "dscpp/model_zoo/gpt.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

using dscpp::checkpoint::PyValue;
namespace mz = dscpp::model_zoo;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: gpt_export '<options json>' out.pt\n";
    return 2;
  }
  try {
    auto options = nlohmann::json::parse(argv[1]);
    mz::GPTConfig config = mz::GPTConfig::from_json(options.at("config"));
    const int64_t batch = options.at("batch"), seq = options.at("seq");
    at::manual_seed(options.at("seed").get<uint64_t>());
    mz::GPT model(config);
    model->train(options.value("train", true));
    at::Tensor ids = at::randint(config.vocab_size, {batch, seq}, at::kLong);
    at::Tensor targets = at::randint(config.vocab_size, {batch, seq}, at::kLong);
    at::Tensor logits = model->forward(ids);
    at::Tensor loss = model->loss(logits, targets);
    loss.backward();

    PyValue state = PyValue::ordered_dict(), grads = PyValue::ordered_dict();
    for (const auto& item : model->named_parameters()) {
      state.set(item.key(), item.value().detach().clone());
      grads.set(item.key(), item.value().grad().clone());
    }
    PyValue root = PyValue::dict();
    root.set("state", std::move(state));
    root.set("grads", std::move(grads));
    root.set("input_ids", ids);
    root.set("targets", targets);
    root.set("logits", logits.detach().clone());
    root.set("loss", loss.detach().clone());
    root.set("num_parameters", config.num_parameters());
    dscpp::checkpoint::save_torch_file(root, argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "gpt_export: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
