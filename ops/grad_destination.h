// Megatron's gradient_accumulation_fusion, our way: a per-parameter "gradient destination"
// that the owner of the gradient storage (ZeRO's buckets) registers, so that a weight's
// gradient product (nn::linear, the tensor-parallel linears, the experts' grouped GEMM) is
// written by the product itself
// into that storage (at::mm_out), or added there in the product's epilogue (addmm_, beta = 1)
// when the slot already holds earlier contributions, instead of being returned to autograd
// and copied in afterwards. The product then returns no gradient for the weight; autograd's
// accumulator still runs (with nothing), so a post-accumulate hook sees the gradient ready,
// already in place. Without a destination (or with the fusion off) nothing changes.
// Keyed by the parameter's TensorImpl: the tensor a product saved for backward is the
// parameter itself (nn::linear and ops::grouped_mm save it), views or casts of it find nothing.
// In ops/ (below nn/ and zero/), since products of both layers write there.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>
#include <vector>

namespace dscpp::ops {

struct GradDestination {
  // Where the gradient of the parameter goes (its shape, its type), and whether what is there
  // is to be added to (true) or overwritten (false). Undefined: no destination this time.
  std::function<at::Tensor(bool& accumulate)> slot;
  // Called once the product has written (or added) this backward's contribution into slot.
  std::function<void()> written;
};

// Registers destinations for params (one each); they stay until the returned handle goes.
// A later registration for the same parameter replaces an earlier one (whose handle then
// removes nothing of it).
std::shared_ptr<void> register_grad_destinations(const std::vector<at::Tensor>& params,
                                                 std::vector<GradDestination> destinations);

// Megatron's switch (gradient_accumulation_fusion), process-wide, default on.
void set_gradient_accumulation_fusion(bool on);
bool gradient_accumulation_fusion();

// Whether weight has a destination now (and the fusion is on): a product that must prepare in
// forward what writing there takes (the grouped GEMM's host counts) asks this first.
bool has_grad_destination(const at::Tensor& weight);

// The general form: if weight's destination gives a contiguous slot of `shape` with like's
// dtype and device, write(slot, accumulate) puts this backward's contribution there (added to
// what it holds when accumulate) and the destination is told: true. False: nothing was
// written, the caller returns the gradient to autograd.
bool write_grad_into(const at::Tensor& weight, at::IntArrayRef shape, const at::Tensor& like,
                     const std::function<void(at::Tensor slot, bool accumulate)>& write);

// The weight gradient dW = a · b (a [out, rows], b [rows, in]) written into
// weight's destination: true if it was (the caller then returns no gradient for weight),
// false if the caller must compute and return it (no destination, fusion off, or a type,
// shape or device that does not match the slot).
bool write_weight_grad(const at::Tensor& weight, const at::Tensor& a, const at::Tensor& b);

}  // namespace dscpp::ops
