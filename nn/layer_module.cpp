// LayerModule: see layer_module.h.
#include "dscpp/nn/layer_module.h"

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>

#include "dscpp/error.h"
#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/module_scope.h"

namespace dscpp::nn {

torch::nn::Module& module_at(torch::nn::Module& root, const std::string& path) {
  torch::nn::Module* at = &root;
  size_t begin = 0;
  while (begin < path.size()) {
    size_t dot = path.find('.', begin);
    if (dot == std::string::npos) dot = path.size();
    const std::string part = path.substr(begin, dot - begin);
    auto children = at->named_children();
    if (auto* found = children.find(part)) {
      at = found->get();
    } else {
      at = at->register_module(part, std::make_shared<torch::nn::Module>()).get();
    }
    begin = dot + 1;
  }
  return *at;
}

LayerModuleImpl::LayerModuleImpl(const std::vector<LayerSpec>& specs) {
  layers_ = build_layers(specs);
  std::map<const torch::nn::Module*, std::string> registered;  // module -> its name
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& spec = specs[i];
    const auto& module = layers_[i].module;
    if (spec.name.empty()) throw dscpp::Error("LayerModule: a layer spec without a name");
    auto [it, fresh] = registered.emplace(module.get(), spec.name);
    if (fresh) {
      const size_t dot = spec.name.rfind('.');
      torch::nn::Module& parent =
          dot == std::string::npos ? *this : module_at(*this, spec.name.substr(0, dot));
      parent.register_module(dot == std::string::npos ? spec.name : spec.name.substr(dot + 1),
                             module);
    }
    std::vector<std::string> names;
    if (!fresh && !spec.tied_weights.empty()) {
      for (const auto& w : spec.tied_weights) names.push_back(it->second + "." + w);
    } else {
      for (const auto& item : module->named_parameters(/*recurse=*/true))
        names.push_back(it->second + "." + item.key());
    }
    layer_params_.push_back(std::move(names));
  }
}

std::vector<std::vector<std::string>> LayerModuleImpl::layer_parameters() const {
  return layer_params_;
}

at::Tensor LayerModuleImpl::forward(at::Tensor x, const at::Tensor& targets) {
  if (targets.defined() && (layers_.empty() || !layers_.back().forward_loss))
    throw dscpp::Error("LayerModule: targets given, but the last layer" +
                       (layers_.empty() ? std::string() : " '" + layers_.back().name + "'") +
                       " computes no loss (its LayerSpec has no forward_loss): compute the "
                       "loss from forward(x)'s output");
  for (size_t i = 0; i < layers_.size(); ++i) {
    const int layer = static_cast<int>(i);
    const bool loss_here = targets.defined() && i + 1 == layers_.size();
    if (hooks_) hooks_->before_forward(layer);
    {
      nn::ModuleScope scope(*layers_[i].module);  // the layer's operators are its module's
      // Hooks gather the layer's parameters and may release them after it (fp8_linear.h).
      std::optional<Fp8WeightCastsNotKept> released;
      if (hooks_) released.emplace();
      x = loss_here ? layers_[i].forward_loss(x, targets) : layers_[i].forward(x);
    }
    if (hooks_) x = hooks_->after_forward(layer, x);
  }
  return x;
}

}  // namespace dscpp::nn
