// FP8 training of linear layers, as Transformer Engine's fp8_autocast and torchao's float8
// training: inside an Fp8Autocast scope, nn::linear multiplies in 8-bit floating point (the
// forward product and both backward products), accumulating in fp32 and returning the input's
// type. Nothing else changes: the parameters stay 16-bit, the master weights fp32, the
// gradients the weight's type; FP8 lives only inside the products.
//
// Formats (Megatron's `fp8`): "e4m3" throughout, or "hybrid": e4m3 for the forward's
// operands, e5m2 (more range, less precision) for the output gradient in backward.
// Scaling (`fp8_recipe`): "tensorwise" (one scale per operand, from its current absolute
// maximum; torchao's default recipe), "rowwise" (one per row of each operand along the
// product's reduced dimension, scales rounded to powers of two; torchao's "rowwise") or
// "delayed" (one per operand, from the amax history of earlier steps; Transformer Engine's
// DelayedScaling, fp8_meta.h).
// `fp8_margin` scales the range down by 2^margin. ops/fp8.h has the arithmetic.
//
// The scope is per thread, and a module applies it in its own forward (the GPT's blocks do,
// from the model config), so that activation checkpointing's recompute in backward, which
// calls that forward again, multiplies the same way. A product whose sizes the GPU's fp8
// kernels do not take (a dimension not a multiple of 16) stays in high precision.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>
#include <string>

#include "dscpp/nn/fp8_recipe.h"

namespace dscpp::nn {

class Fp8MetaImpl;

// What an Fp8Autocast scope holds: the recipe, the module's delayed-scaling state and the slot
// its next product takes.
struct Fp8ScopeState {
  std::optional<Fp8Recipe> recipe;
  Fp8MetaImpl* meta = nullptr;
  int64_t next_slot = 0;
};

// FP8 products for nn::linear on this thread while it lives (nullopt: high precision, e.g.
// the layers a model keeps in bf16 inside an enclosing scope). Scopes nest; the innermost holds.
// A delayed recipe needs `meta`, the module's state (fp8_meta.h): the products made in the
// scope take its slots in call order from 0, the same again in a recompute.
class Fp8Autocast {
 public:
  explicit Fp8Autocast(std::optional<Fp8Recipe> recipe, Fp8MetaImpl* meta = nullptr);
  ~Fp8Autocast();
  Fp8Autocast(const Fp8Autocast&) = delete;
  Fp8Autocast& operator=(const Fp8Autocast&) = delete;

 private:
  Fp8ScopeState saved_;
};

// While one lives on this thread, the FP8 linear does not keep forward's cast of the weight
// (Wᵀ in fp8) for backward, and casts the weight again there. A layer whose parameters are
// released after its forward (ZeRO stage 3 layer by layer: nn::LayerModule with hooks opens
// one around such a layer) would otherwise hold a byte a parameter until its backward, beyond
// ZeRO-3's bound on the parameters a rank holds. Scopes nest.
class Fp8WeightCastsNotKept {
 public:
  Fp8WeightCastsNotKept();
  ~Fp8WeightCastsNotKept();
  Fp8WeightCastsNotKept(const Fp8WeightCastsNotKept&) = delete;
  Fp8WeightCastsNotKept& operator=(const Fp8WeightCastsNotKept&) = delete;

 private:
  bool saved_;
};

// Throws ops::fp8::Fp8Error where fp8 cannot train: with fp16 (FP8 keeps the parameters bf16;
// fp16's loss scaling and fp8's scales would fight), or on a GPU without FP8 tensor cores
// (compute capability below 8.9). The CPU runs fp8 products through ATen (for tests).
void check_fp8_usable(const c10::Device& device, bool fp16);

// The recipe in force on this thread, or nullptr.
const Fp8Recipe* current_fp8_recipe();

// Whether a product of x [..., in] and weight [out, in] goes through fp8 under `recipe`
// (sizes the device's kernels take).
bool fp8_applies(const at::Tensor& x, const at::Tensor& weight);

// x · weightᵀ + bias with its three products in fp8 (an autograd function that saves the
// weight parameter itself, as nn::linear: stage 3 gathers it again for backward). The weight's
// gradient goes to its ZeRO destination where one is registered (ops/grad_destination.h).
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                      const Fp8Recipe& recipe);

}  // namespace dscpp::nn
