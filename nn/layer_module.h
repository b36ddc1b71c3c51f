// LayerModule: a model given as a LayerSpec list, built in this process as one module
// (DeepSpeed's PipelineModule on one stage). Each layer's module is registered under the
// spec's dotted name ("blocks.3" becomes child "3" of a child "blocks"), so state_dict keys
// are those of the whole model; a tied spec reuses the first one's module and registers
// nothing. forward runs the layers in order, calling the ZeRO stage-3 hooks around each
// when the engine has installed them (nn::Layered), so parameters are gathered a layer
// at a time.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <string>
#include <vector>

#include "dscpp/nn/layer_hooks.h"
#include "dscpp/nn/layer_spec.h"

namespace dscpp::nn {

// The module under `path` (dot-separated) in root, made as an empty container where missing:
// how a layer's whole-model name ("blocks.3") becomes nested children.
torch::nn::Module& module_at(torch::nn::Module& root, const std::string& path);

class LayerModuleImpl : public torch::nn::Module, public nn::Layered {
 public:
  explicit LayerModuleImpl(const std::vector<LayerSpec>& specs);

  // The layers in order on x. With targets, the last layer's forward_loss gives the loss
  // instead of its output (throws dscpp::Error where the last layer has none).
  at::Tensor forward(at::Tensor x, const at::Tensor& targets = {});

  const std::vector<Layer>& layers() const { return layers_; }
  // Per layer: its module's parameters under their whole-model names; a tied layer uses
  // only its tied_weights of the module it shares (all of them when it names none).
  std::vector<std::vector<std::string>> layer_parameters() const override;
  void set_layer_hooks(nn::LayerHooks* hooks) override { hooks_ = hooks; }

 private:
  std::vector<Layer> layers_;
  std::vector<std::vector<std::string>> layer_params_;
  nn::LayerHooks* hooks_ = nullptr;
};
TORCH_MODULE(LayerModule);

}  // namespace dscpp::nn
