// LayerSpec: a model as a list of layers, each described rather than built (DeepSpeed's
// pipe LayerSpec / TiedLayerSpec). The pipeline engine builds only its stage's layers and
// ZeRO stage 3 gathers parameters layer by layer; build_layers / run_layers give the
// single-process form. The activation between layers is one tensor.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dscpp::nn {

struct LayerSpec {
  // Where the layer's parameters live in the whole model ("blocks.3"): a state dict key of
  // the whole model is name + "." + the key inside the layer.
  std::string name;
  // A new module with initialised weights.
  std::function<std::shared_ptr<torch::nn::Module>()> build;
  // The layer's forward on a module `build` made: activation in, activation out.
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward;
  // DeepSpeed's TiedLayerSpec key. Specs with the same non-empty key run one module, built by
  // the first of them (e.g. the output head multiplies by the token embedding's weight); a
  // later one's `build` is not called. "": the layer has a module of its own.
  std::string tied_key;
  // The parameters shared under tied_key (DeepSpeed's tied_weight_attr): where tied layers
  // sit on different pipeline stages, each stage holds a copy and their gradients are summed.
  std::vector<std::string> tied_weights;
};

// A built layer.
struct Layer {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;  // shared between tied layers
  std::function<at::Tensor(const at::Tensor&)> forward;
};

// Builds every spec in order, in this process; tied specs share one module.
inline std::vector<Layer> build_layers(const std::vector<LayerSpec>& specs) {
  std::vector<Layer> layers;
  std::map<std::string, std::shared_ptr<torch::nn::Module>> tied;
  for (const auto& spec : specs) {
    std::shared_ptr<torch::nn::Module> module;
    if (!spec.tied_key.empty() && tied.count(spec.tied_key)) {
      module = tied[spec.tied_key];
    } else {
      module = spec.build();
      if (!spec.tied_key.empty()) tied[spec.tied_key] = module;
    }
    auto forward = [module, f = spec.forward](const at::Tensor& x) { return f(*module, x); };
    layers.push_back({spec.name, module, std::move(forward)});
  }
  return layers;
}

// The layers one after another: what the whole model's forward computes.
inline at::Tensor run_layers(const std::vector<Layer>& layers, at::Tensor x) {
  for (const auto& layer : layers) x = layer.forward(x);
  return x;
}

}  // namespace dscpp::nn
