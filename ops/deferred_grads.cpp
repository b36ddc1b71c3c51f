// The split backward's store and scope (deferred_grads.h).
#include "dscpp/ops/deferred_grads.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/functions/accumulate_grad.h>
#include <torch/csrc/autograd/variable.h>

#include <atomic>
#include <unordered_map>

#include "dscpp/error.h"

namespace dscpp::ops {

struct DeferredGrads::Impl {
  struct Entry {
    std::shared_ptr<torch::autograd::Node> accumulator;
    at::Tensor param;
    at::Tensor captured;  // the sum of the gradients computed in B
    std::vector<std::function<at::Tensor()>> products;
  };
  std::mutex mutex;
  std::vector<Entry> entries;
  std::unordered_map<const torch::autograd::Node*, size_t> index;

  Entry& entry(const std::shared_ptr<torch::autograd::Node>& accumulator, const at::Tensor& param) {
    auto [it, fresh] = index.try_emplace(accumulator.get(), entries.size());
    if (fresh) entries.push_back({accumulator, param, {}, {}});
    return entries[it->second];
  }
};

namespace {

std::atomic<DeferredGrads::Impl*> open_scope{nullptr};

// Hands grad to the accumulator as autograd's engine would: its apply, then its post hooks
// (ZeRO's ready hook among them). An undefined grad still runs them: a product wrote into the
// destination, and the hooks must hear that the gradient is complete.
void deliver(const std::shared_ptr<torch::autograd::Node>& accumulator, const at::Tensor& grad) {
  torch::autograd::variable_list inputs{grad};
  torch::autograd::variable_list outputs = (*accumulator)(torch::autograd::variable_list(inputs));
  for (const auto& hook : accumulator->post_hooks()) outputs = (*hook)(outputs, inputs);
}

class CaptureHook : public torch::autograd::FunctionPreHook {
 public:
  explicit CaptureHook(std::weak_ptr<torch::autograd::Node> accumulator)
      : accumulator_(std::move(accumulator)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    // Outside a split backward (every other backward) this is the one check it costs.
    if (!capturing() || grads.empty() || !grads[0].defined()) return grads;
    auto node = accumulator_.lock();
    if (node && capture_grad(node, grads[0])) return {at::Tensor()};
    return grads;
  }

 private:
  std::weak_ptr<torch::autograd::Node> accumulator_;
};

}  // namespace

DeferredGrads::DeferredGrads() : impl_(std::make_unique<Impl>()) {}
DeferredGrads::~DeferredGrads() = default;
DeferredGrads::DeferredGrads(DeferredGrads&&) noexcept = default;
DeferredGrads& DeferredGrads::operator=(DeferredGrads&&) noexcept = default;

void DeferredGrads::run() {
  if (open_scope.load() == impl_.get())
    throw dscpp::Error("DeferredGrads::run inside its own DeferGrads scope");
  std::vector<Impl::Entry> entries;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    entries.swap(impl_->entries);
    impl_->index.clear();
  }
  at::NoGradGuard no_grad;
  for (auto& e : entries) {
    at::Tensor sum = e.captured;
    for (auto& product : e.products) {
      at::Tensor g = product();
      if (g.defined()) sum = sum.defined() ? sum + g : g;
    }
    deliver(e.accumulator, sum);
  }
}

bool DeferredGrads::empty() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->entries.empty();
}

int DeferredGrads::split_params() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  int n = 0;
  for (const auto& e : impl_->entries) n += e.products.empty() ? 0 : 1;
  return n;
}

int DeferredGrads::unsplit_params() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  int n = 0;
  for (const auto& e : impl_->entries) n += e.products.empty() ? 1 : 0;
  return n;
}

std::vector<at::Tensor> DeferredGrads::unsplit_matrices() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::vector<at::Tensor> out;
  for (const auto& e : impl_->entries)
    if (e.products.empty() && e.param.defined() && e.param.dim() >= 2) out.push_back(e.param);
  return out;
}

DeferGrads::DeferGrads(DeferredGrads& into) {
  DeferredGrads::Impl* expected = nullptr;
  if (!open_scope.compare_exchange_strong(expected, into.impl_.get()))
    throw dscpp::Error("DeferGrads: a scope is open already (scopes do not nest)");
}

DeferGrads::~DeferGrads() {
  open_scope.store(nullptr);
}

bool capturing() {
  return open_scope.load() != nullptr;
}

bool defer_weight_grad(const at::Tensor& weight, std::function<at::Tensor()> product) {
  DeferredGrads::Impl* scope = open_scope.load();
  if (!scope || !weight.requires_grad() || !weight.is_leaf()) return false;
  auto accumulator = torch::autograd::impl::grad_accumulator(weight);
  if (!accumulator) return false;
  std::lock_guard<std::mutex> lock(scope->mutex);
  scope->entry(accumulator, weight).products.push_back(std::move(product));
  return true;
}

bool capture_grad(const std::shared_ptr<torch::autograd::Node>& accumulator,
                  const at::Tensor& grad) {
  DeferredGrads::Impl* scope = open_scope.load();
  if (!scope) return false;
  at::Tensor param;
  if (auto* acc = dynamic_cast<torch::autograd::AccumulateGrad*>(accumulator.get()))
    param = acc->variable;
  std::lock_guard<std::mutex> lock(scope->mutex);
  auto& e = scope->entry(accumulator, param);
  // Kept as given: autograd would have let the accumulator take it as it is, too.
  e.captured = e.captured.defined() ? e.captured + grad : grad;
  return true;
}

void add_capture_hook(const at::Tensor& param) {
  auto accumulator = torch::autograd::impl::grad_accumulator(param);
  if (!accumulator) return;
  accumulator->add_pre_hook(std::make_unique<CaptureHook>(accumulator));
}

}  // namespace dscpp::ops
