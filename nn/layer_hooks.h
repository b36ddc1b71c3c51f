// How a model made of layers (model_zoo's LayerModule, from a LayerSpec list) lets ZeRO
// stage 3 gather its parameters layer by layer: the model calls LayerHooks around each
// layer's forward, and tells the engine, through Layered, which parameters each layer uses.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace dscpp::nn {

class LayerHooks {
 public:
  virtual ~LayerHooks() = default;
  // Before layer i's forward: its parameters must hold their values when this returns.
  virtual void before_forward(int layer) = 0;
  // After it, with its output; returns what the next layer takes (the output, or an alias
  // of it through which backward announces the layer's backward).
  virtual at::Tensor after_forward(int layer, const at::Tensor& output) = 0;
};

class Layered {
 public:
  virtual ~Layered() = default;
  // For each layer in forward order, the state_dict names of the parameters its forward uses.
  virtual std::vector<std::vector<std::string>> layer_parameters() const = 0;
  // nullptr: run the layers plainly.
  virtual void set_layer_hooks(LayerHooks* hooks) = 0;
};

}  // namespace dscpp::nn
