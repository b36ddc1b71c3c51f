// ModuleScope: marks one module's forward for observers of LibTorch's record functions (the
// flops profiler, runtime/profiler), which LibTorch modules cannot tell otherwise: they have
// no forward hooks. It opens a user-scope record function named kModuleScopeName whose one
// input is the module's address, so an observer that knows the module tree attributes the
// operators run inside to that module. With no observer listening it costs one thread-local
// check. The LayerModule opens one per layer, model_zoo's modules one in each forward.
//   at::Tensor MyBlockImpl::forward(const at::Tensor& x) { nn::ModuleScope scope(*this); ... }
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <torch/nn/module.h>

#include <vector>

namespace dscpp::nn {

inline constexpr const char* kModuleScopeName = "dscpp::module";

class ModuleScope {
 public:
  explicit ModuleScope(const torch::nn::Module& module);
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;

  // The module a scope's record function names (its input), as an observer reads it back.
  static const torch::nn::Module* module_of(const at::RecordFunction& fn);

 private:
  std::vector<c10::IValue> inputs_;  // before guard_: the record function keeps a view of it
  at::RecordFunction guard_;         // its destructor closes the scope
};

}  // namespace dscpp::nn
