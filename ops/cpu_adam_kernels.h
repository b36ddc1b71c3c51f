// The kernels behind cpu_adam.h on raw pointers, one table per instruction set. This header
// is shared by the dispatcher and by the three units that compile the bodies
// (cpu_adam_kernels_impl.h) with their own flags.
#pragma once

#include <cstdint>

namespace dscpp::ops::cpu::kernels {

enum class Type { kNone, kFloat, kBFloat16, kHalf };

// One range of a step: [begin, end) of every array (the dispatcher splits a step over threads).
struct Arrays {
  float* param = nullptr;
  const void* grad = nullptr;
  Type grad_type = Type::kFloat;
  float* state0 = nullptr;  // Adam's exp_avg, Adagrad's sum, Lion's exp_avg
  float* state1 = nullptr;  // Adam's exp_avg_sq
  void* copy = nullptr;     // the updated parameters' copy, or nullptr
  Type copy_type = Type::kNone;
};

// The step's scalars, already in the kernels' fp32 (see cpu_adam.cpp for how each is made).
struct Scalars {
  float grad_scale = 1;
  float beta1 = 0, beta2 = 0, one_minus_beta1 = 0, one_minus_beta2 = 0;
  float eps = 0;
  float step_size = 0;         // Adam: -lr / bias_correction1; Adagrad: -clr; Lion: -lr
  float bias_correction2 = 1;  // Adam: 1 / sqrt(1 - beta2^step) (1 without bias correction)
  float weight_decay = 0;      // the factor the algorithm applies (see the kernels)
  bool decay = false;          // weight decay on
  bool decoupled = false;      // Adam: AdamW's decay
};

using Kernel = void (*)(const Arrays&, const Scalars&, int64_t begin, int64_t end);
// The sum of the squares of elements [begin, end) of `data` (fp32, bf16 or fp16), each widened
// exactly and squared and added in double: one block of ops/sum_of_squares.cpp, the gradient
// norm's share of an offloaded partition.
using SumOfSquares = double (*)(const void* data, Type type, int64_t begin, int64_t end);
struct Table {
  Kernel adam, adagrad, lion;
  SumOfSquares sum_of_squares;
};

// The table for this CPU (ATen's capability, which ATEN_CPU_CAPABILITY can lower).
const Table& best_table();

// Each in its own namespace, compiled with its own flags; avx2/avx512 are null where this
// build did not compile them.
namespace DEFAULT {
Table table();
}
namespace AVX2 {
Table table();
}
namespace AVX512 {
Table table();
}

}  // namespace dscpp::ops::cpu::kernels
