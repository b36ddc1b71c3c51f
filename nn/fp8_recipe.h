// The FP8 recipe of a linear layer's products (nn/fp8_linear.h) and its parser from the model
// config's values (Megatron's `fp8`, `fp8_recipe`, `fp8_margin`). No LibTorch: the model config
// parser (and its fuzzer) reads it.
#pragma once

#include <string>

namespace dscpp::nn {

enum class Fp8Scaling { Tensorwise, Rowwise };

struct Fp8Recipe {
  bool hybrid = true;  // e5m2 for the output gradient; false: e4m3 throughout
  Fp8Scaling scaling = Fp8Scaling::Tensorwise;
  int margin = 0;
};

// Parses the model config's values: fmt "hybrid" | "e4m3", recipe "tensorwise" | "rowwise".
// Throws ops::fp8::Fp8Error naming the value and what is accepted.
Fp8Recipe fp8_recipe_from(const std::string& fmt, const std::string& recipe, int margin);

}  // namespace dscpp::nn
