// A user's program: compiles against the installed <dscpp/dscpp.h> alone (with LibTorch's own
// headers for its model), resolves a config, then trains a linear layer one ZeRO-2 step on one
// process and checks that the step moved its weights.
#include <dscpp/dscpp.h>
#include <torch/nn/modules/linear.h>

#include <iostream>

int main() {
  dscpp::ConfigOptions options;
  options.world_size = 4;
  auto c = dscpp::load_ds_config(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})",
                                 options);
  std::cout << "micro_batch=" << c.train_micro_batch_size_per_gpu << "\n";
  if (c.train_micro_batch_size_per_gpu != 4) return 1;

  torch::nn::Linear model(4, 2);
  auto engine = dscpp::initialize(model, nlohmann::json::parse(R"({
    "train_micro_batch_size_per_gpu": 2,
    "optimizer": {"type": "SGD", "params": {"lr": 0.5}}, "gradient_clipping": 0,
    "zero_optimization": {"stage": 2}})"));
  const at::Tensor before = model->weight.detach().clone();  // on engine.device()
  at::Tensor loss = engine.forward(at::ones({2, 4}).to(engine.device())).sum();
  engine.backward(loss);
  engine.step();
  // d(sum of outputs)/d(weight) is 2 for every element (two rows of ones): lr 0.5 moves each by -1.
  const at::Tensor delta = (model->weight.detach() - before).cpu();
  const bool moved = delta.add(1.0).abs().max().item<double>() < 1e-6;
  std::cout << "trained=" << moved << "\n";
  if (!moved) std::cout << "weight moved by " << delta << " (expected -1 everywhere)\n";
  return moved ? 0 : 1;
}
