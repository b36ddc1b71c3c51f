// The gradient destinations: one process-wide map from a parameter's TensorImpl.
#include "dscpp/ops/grad_destination.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <unordered_map>

namespace dscpp::ops {

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

namespace {

// The destination registered for weight, if the fusion is on and there is one.
std::optional<GradDestination> destination_of(const at::Tensor& weight) {
  if (!fusion_on) return std::nullopt;
  std::lock_guard<std::mutex> lock(registry_mutex());
  if (registry().empty()) return std::nullopt;
  auto it = registry().find(weight.unsafeGetTensorImpl());
  if (it == registry().end()) return std::nullopt;
  return it->second.destination;
}

}  // namespace

bool has_grad_destination(const at::Tensor& weight) {
  return destination_of(weight).has_value();
}

bool write_grad_into(const at::Tensor& weight, at::IntArrayRef shape, const at::Tensor& like,
                     const std::function<void(at::Tensor slot, bool accumulate)>& write) {
  const std::optional<GradDestination> d = destination_of(weight);
  if (!d) return false;
  bool accumulate = false;
  at::Tensor slot = d->slot(accumulate);
  if (!slot.defined() || slot.sizes() != shape || slot.scalar_type() != like.scalar_type() ||
      slot.device() != like.device() || !slot.is_contiguous())
    return false;
  {
    at::NoGradGuard no_grad;
    write(slot, accumulate);
  }
  d->written();
  return true;
}

bool write_weight_grad(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type()) return false;
  return write_grad_into(weight, {a.size(0), b.size(1)}, a, [&](at::Tensor slot, bool accumulate) {
    if (accumulate)
      slot.addmm_(a, b);  // beta = 1: the sum in the product's epilogue
    else
      at::mm_out(slot, a, b);
  });
}

}  // namespace dscpp::ops
