// LayerSpec: a model as a list of layers, each described rather than built (DeepSpeed's
// pipe LayerSpec / TiedLayerSpec). The pipeline engine builds only its stage's layers and
// ZeRO stage 3 gathers parameters layer by layer; build_layers / run_layers give the
// single-process form. The activation between layers is one tensor, or, for a layer that
// gives forward_tuple, several (DeepSpeed's pipeline passes tuples: activations and masks).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/error.h"

namespace dscpp::nn {

// The activation between layers in its general form: one tensor or several.
using Activation = std::vector<at::Tensor>;

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
  // Instead of `forward`, for a layer that takes or gives several tensors. Empty: the layer
  // is one tensor in, one out, through `forward` (the form model_zoo and ZeRO-3 use).
  std::function<Activation(torch::nn::Module&, const Activation&)> forward_tuple = {};
  // For a last layer: the loss from its input and the targets, without its output ever held
  // whole (the GPT head's tiled loss). Empty: the caller computes the loss from the output.
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&, const at::Tensor&)> forward_loss =
      {};
};

// A built layer.
struct Layer {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;  // shared between tied layers
  // One tensor in, one out; for a tuple layer, its forward_tuple on {x}, which must give one
  // tensor.
  std::function<at::Tensor(const at::Tensor&)> forward;
  // The general form, for every layer (a one-tensor layer on a one-tensor activation).
  std::function<Activation(const Activation&)> forward_tuple;
  // The spec's forward_loss on the module (input, targets); empty where the spec has none.
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> forward_loss = {};
};

// The one-tensor and general forms of spec's forward on `module`.
inline void bind_forward(const LayerSpec& spec, const std::shared_ptr<torch::nn::Module>& module,
                         Layer& layer) {
  if (spec.forward_loss) {
    auto f = spec.forward_loss;
    layer.forward_loss = [module, f](const at::Tensor& x, const at::Tensor& targets) {
      return f(*module, x, targets);
    };
  }
  if (spec.forward_tuple) {
    auto f = spec.forward_tuple;
    std::string name = spec.name;
    layer.forward_tuple = [module, f](const Activation& x) { return f(*module, x); };
    layer.forward = [module, f, name](const at::Tensor& x) {
      Activation out = f(*module, {x});
      if (out.size() != 1)
        throw dscpp::Error("layer '" + name + "' gives " + std::to_string(out.size()) +
                           " tensors where one is expected (run the layers as tuples)");
      return out[0];
    };
    return;
  }
  auto f = spec.forward;
  std::string name = spec.name;
  layer.forward = [module, f](const at::Tensor& x) { return f(*module, x); };
  layer.forward_tuple = [module, f, name](const Activation& x) {
    if (x.size() != 1)
      throw dscpp::Error("layer '" + name + "' takes one tensor, given " +
                         std::to_string(x.size()) + " (give it a forward_tuple)");
    return Activation{f(*module, x[0])};
  };
}

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
    Layer layer{spec.name, module, {}, {}};
    bind_forward(spec, module, layer);
    layers.push_back(std::move(layer));
  }
  return layers;
}

// The layers one after another: what the whole model's forward computes.
inline at::Tensor run_layers(const std::vector<Layer>& layers, at::Tensor x) {
  for (const auto& layer : layers) x = layer.forward(x);
  return x;
}
inline Activation run_layers(const std::vector<Layer>& layers, Activation x) {
  for (const auto& layer : layers) x = layer.forward_tuple(x);
  return x;
}

}  // namespace dscpp::nn
