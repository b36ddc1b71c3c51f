// ModuleScope: see module_scope.h.
// LibTorch is built with NDEBUG, and RecordFunction::inputs() asserts, without it, on a
// debug-only flag that LibTorch's own (NDEBUG) code never sets: read it as LibTorch does.
#ifndef NDEBUG
#define NDEBUG
#endif
#include "dscpp/nn/module_scope.h"

#include <cstdint>
#include <cstring>

namespace dscpp::nn {

ModuleScope::ModuleScope(const torch::nn::Module& module) : guard_(at::RecordScope::USER_SCOPE) {
  if (!guard_.isActive()) return;
  if (guard_.needsInputs()) {
    inputs_.emplace_back(static_cast<int64_t>(reinterpret_cast<std::uintptr_t>(&module)));
    guard_.before(kModuleScopeName,
                  c10::ArrayRef<const c10::IValue>(inputs_.data(), inputs_.size()));
  } else {
    guard_.before(kModuleScopeName);
  }
}

const torch::nn::Module* ModuleScope::module_of(const at::RecordFunction& fn) {
  if (fn.scope() != at::RecordScope::USER_SCOPE || std::strcmp(fn.name(), kModuleScopeName) != 0)
    return nullptr;
  const auto inputs = fn.inputs();
  if (inputs.size() != 1 || !inputs[0].isInt()) return nullptr;
  return reinterpret_cast<const torch::nn::Module*>(static_cast<std::uintptr_t>(inputs[0].toInt()));
}

}  // namespace dscpp::nn
