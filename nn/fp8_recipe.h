// The FP8 recipe of a linear layer's products (nn/fp8_linear.h) and its parser from the model
// config's values (Megatron's `fp8`, `fp8_recipe`, `fp8_margin`, `fp8_amax_history_len`,
// `fp8_amax_compute_algo`). No LibTorch: the model config parser (and its fuzzer) reads it.
#pragma once

#include <string>

namespace dscpp::nn {

// Tensorwise and rowwise scale each operand by its own current absolute maximum (torchao's
// recipes); delayed scales it by an amax history kept from earlier steps (Transformer Engine's
// DelayedScaling, Megatron's "delayed"): one scale per operand, as tensorwise.
enum class Fp8Scaling { Tensorwise, Rowwise, Delayed };

// Delayed: the amax a scale is computed from, the newest one or the largest in the history.
enum class Fp8AmaxAlgo { MostRecent, Max };

struct Fp8Recipe {
  bool hybrid = true;  // e5m2 for the output gradient; false: e4m3 throughout
  Fp8Scaling scaling = Fp8Scaling::Tensorwise;
  int margin = 0;
  // Delayed only, with Megatron's defaults: the steps of amax history kept per operand, and
  // which amax of it sets the scale.
  int amax_history_len = 1;
  Fp8AmaxAlgo amax_compute_algo = Fp8AmaxAlgo::MostRecent;
};

// Parses the model config's values: fmt "hybrid" | "e4m3", recipe "tensorwise" | "rowwise" |
// "delayed", margin in [0, 32], history_len in [1, 65536], algo "most_recent" | "max".
// Throws ops::fp8::Fp8Error naming the value and what is accepted.
Fp8Recipe fp8_recipe_from(const std::string& fmt, const std::string& recipe, int margin,
                          int history_len = 1, const std::string& algo = "most_recent");

}  // namespace dscpp::nn
