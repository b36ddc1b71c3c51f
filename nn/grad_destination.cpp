// The gradient destinations: one process-wide map from a parameter's TensorImpl.
#include "dscpp/nn/grad_destination.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace dscpp::nn {

namespace {

struct Entry {
  GradDestination destination;
  const void* owner;  // the registration's handle
};

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}

std::unordered_map<const c10::TensorImpl*, Entry>& registry() {
  static std::unordered_map<const c10::TensorImpl*, Entry> r;
  return r;
}

std::atomic<bool> fusion_on{true};

struct Registration {
  std::vector<const c10::TensorImpl*> keys;
  ~Registration() {
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (const auto* k : keys) {
      auto it = registry().find(k);
      if (it != registry().end() && it->second.owner == this) registry().erase(it);
    }
  }
};

}  // namespace

std::shared_ptr<void> register_grad_destinations(const std::vector<at::Tensor>& params,
                                                 std::vector<GradDestination> destinations) {
  auto handle = std::make_shared<Registration>();
  std::lock_guard<std::mutex> lock(registry_mutex());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto* key = params[i].unsafeGetTensorImpl();
    handle->keys.push_back(key);
    registry()[key] = Entry{std::move(destinations.at(i)), handle.get()};
  }
  return handle;
}

void set_gradient_accumulation_fusion(bool on) {
  fusion_on = on;
}

bool gradient_accumulation_fusion() {
  return fusion_on;
}

bool write_weight_grad(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b) {
  if (!fusion_on) return false;
  GradDestination d;
  {
    std::lock_guard<std::mutex> lock(registry_mutex());
    if (registry().empty()) return false;
    auto it = registry().find(weight.unsafeGetTensorImpl());
    if (it == registry().end()) return false;
    d = it->second.destination;
  }
  bool accumulate = false;
  at::Tensor slot = d.slot(accumulate);
  if (!slot.defined() || slot.dim() != 2 || slot.size(0) != a.size(0) ||
      slot.size(1) != b.size(1) || slot.scalar_type() != a.scalar_type() ||
      slot.scalar_type() != b.scalar_type() || slot.device() != a.device() || !slot.is_contiguous())
    return false;
  at::NoGradGuard no_grad;
  if (accumulate)
    slot.addmm_(a, b);  // beta = 1: the sum in the product's epilogue
  else
    at::mm_out(slot, a, b);
  d.written();
  return true;
}

}  // namespace dscpp::nn
