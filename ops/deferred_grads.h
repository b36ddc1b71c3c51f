// A backward split in two, as zero-bubble pipeline schedules run it: B (the inputs'
// gradients, on the pipeline's critical path) now, W (the parameters' gradients) later.
//
// While a DeferGrads scope is open, a backward puts off two things into its DeferredGrads:
//   - the weight-gradient products of the layers that split (nn::linear and the products
//     built on it): defer_weight_grad takes the product as a closure over what it needs (the
//     layer's input and the output's gradient), and the layer returns no gradient for the
//     weight;
//   - every gradient autograd would accumulate into a parameter (a layer that does not split,
//     a bias, a norm's weight): parameters whose accumulators have capture hooks
//     (add_capture_hook; ZeRO installs them on every parameter it holds) hand the gradient to
//     the scope instead, and their accumulators see nothing (ready hooks must ignore that
//     call: capturing() says so).
// DeferredGrads::run() later (W) computes the put-off products and hands each parameter its
// gradient through its accumulator, as autograd would have: the gradient accumulation fusion's
// destination first (grad_destination.h), then the accumulator and its post hooks with the
// sum of what is left. Gradients arrive per parameter in the order their first piece was put
// off. The values are the products autograd would have made (the same calls on the same
// tensors); only when they run moves.
// The scope is process-wide (autograd runs a device's backward on its own thread): one
// backward under a scope at a time.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace torch::autograd {
struct Node;
}

namespace dscpp::ops {

class DeferredGrads {
 public:
  DeferredGrads();
  ~DeferredGrads();
  DeferredGrads(DeferredGrads&&) noexcept;
  DeferredGrads& operator=(DeferredGrads&&) noexcept;

  // W: every put-off product and gradient delivered; empty afterwards. Call it outside a scope,
  // where the parameters' gradients may be received (inside ZeRO's backward).
  void run();
  bool empty() const;
  // Of the parameters whose gradients were put off: how many had a product put off (split
  // layers) and how many only gradients computed in B (layers that do not split).
  int split_params() const;
  int unsplit_params() const;
  // The parameters with a gradient computed in B and no product put off, matrices only (two or
  // more dimensions): the layers that did not split, for the engine's one-time note.
  std::vector<at::Tensor> unsplit_matrices() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  friend class DeferGrads;
  friend bool defer_weight_grad(const at::Tensor&, std::function<at::Tensor()>);
  friend bool capture_grad(const std::shared_ptr<torch::autograd::Node>&, const at::Tensor&);
};

// Opens (and on destruction closes) the process-wide scope into `into`. Scopes do not nest (a
// second one throws dscpp::Error), nor does run() inside its own.
class DeferGrads {
 public:
  explicit DeferGrads(DeferredGrads& into);
  ~DeferGrads();
  DeferGrads(const DeferGrads&) = delete;
  DeferGrads& operator=(const DeferGrads&) = delete;
};

// Whether a scope is open.
bool capturing();

// In a layer's backward: true if a scope is open and took `product` (the weight's gradient,
// computed in W, in the weight's shape; or an undefined tensor when the product wrote it into
// the weight's gradient destination itself). The layer then returns no gradient for weight.
// False: no scope (or weight needs no gradient); the layer computes it now.
bool defer_weight_grad(const at::Tensor& weight, std::function<at::Tensor()> product);

// A capture hook's work: true if a scope is open and took `grad` for the parameter whose
// accumulator is `accumulator` (added to what it holds for it).
bool capture_grad(const std::shared_ptr<torch::autograd::Node>& accumulator,
                  const at::Tensor& grad);

// Installs, on param's gradient accumulator, the pre-hook that hands its gradient to an open
// scope (capture_grad) and lets nothing through meanwhile.
void add_capture_hook(const at::Tensor& param);

}  // namespace dscpp::ops
