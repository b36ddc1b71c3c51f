// Delayed scaling's state for the FP8 products of one module (a transformer block), as
// Transformer Engine's fp8_meta: for each product (a slot: the module's nn::linear calls in the
// order its forward makes them), the amax history and the quantising factor (`scale`: fp8 value
// = x · scale) of its three operands, x, the weight and the output gradient (column 3·slot + 0,
// 1, 2).
//
// A step of it: every quantisation casts with the scale in force and records its operand's
// absolute maximum into row 0 of the history as the largest seen since the last update (the
// micro-batches of a step, activation checkpointing's recompute: a maximum is idempotent).
// After the optimizer's step, update_fp8_metas reduces row 0 to its maximum over the data-
// parallel ranks (so that every rank casts alike and a checkpoint's one copy resumes every
// rank), takes each operand's amax (row 0, or the largest of the history with "max"), sets the
// scale max / (amax · 2^margin) where that amax is finite and positive (else keeps it), and
// rolls the history: row 0 becomes the newest row, the oldest drops out, row 0 starts at zero.
// The scales start at 1.
//
// A submodule, so that its tensors are the module's buffers (`<module>.fp8_meta.amax_history`
// [history_len, 3 · products] and `.scale` [3 · products]): checkpoints save and load them by
// name as every buffer. They stay fp32 when the module is cast to 16 bits.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>

#include "dscpp/nn/fp8_recipe.h"

namespace dscpp::nn {

class Fp8MetaImpl : public torch::nn::Module {
 public:
  // Room for `products` slots; recipe: a delayed one (its format, margin, history length, algo).
  Fp8MetaImpl(int64_t products, const Fp8Recipe& recipe);

  // To a device, never to a 16-bit type: amaxes and factors keep fp32.
  void to(torch::Device device, torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Dtype dtype, bool non_blocking = false) override;
  void to(torch::Device device, bool non_blocking = false) override;

  int64_t products() const { return scale.size(0) / 3; }
  const Fp8Recipe& recipe() const { return recipe_; }

  // Row 0 of the history after the ranks' reduction: the scales and the rolled history.
  void update(const at::Tensor& reduced_row0);

  at::Tensor amax_history;  // [history_len, 3 · products]
  at::Tensor scale;         // [3 · products]

 private:
  Fp8Recipe recipe_;
};
TORCH_MODULE(Fp8Meta);

// The slots a module's Fp8Meta needs: its matrices (2-D parameters, its submodules' too), each
// multiplied once a forward by nn::linear.
int64_t fp8_products_of(const torch::nn::Module& module);

// The operand columns of a slot.
enum class Fp8Operand : int { Input = 0, Weight = 1, OutputGrad = 2 };

// Records amax (an fp32 scalar) into row 0 of `history` at column 3 · slot + operand, as the
// maximum with what is there (the tensors of an Fp8Meta, which backward holds beyond the scope).
void record_fp8_amax(const at::Tensor& history, int64_t slot, Fp8Operand operand,
                     const at::Tensor& amax);

// Every Fp8Meta under `module` updated, after each optimizer step (the engine calls it):
// reduce_max takes one fp32 tensor (every meta's row 0, concatenated) and reduces it to its
// elementwise maximum over the ranks that hold the same modules; nullptr on one rank.
void update_fp8_metas(torch::nn::Module& module,
                      const std::function<void(at::Tensor&)>& reduce_max);

}  // namespace dscpp::nn
