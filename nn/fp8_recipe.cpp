// The FP8 recipe's parser: see fp8_recipe.h.
#include "dscpp/nn/fp8_recipe.h"

#include "dscpp/ops/fp8_error.h"

namespace dscpp::nn {

namespace fp8 = ops::fp8;

Fp8Recipe fp8_recipe_from(const std::string& fmt, const std::string& recipe, int margin,
                          int history_len, const std::string& algo) {
  Fp8Recipe r;
  if (fmt == "hybrid") {
    r.hybrid = true;
  } else if (fmt == "e4m3") {
    r.hybrid = false;
  } else {
    throw fp8::Fp8Error("fp8: expected \"hybrid\" or \"e4m3\", found \"" + fmt + "\"");
  }
  if (recipe == "tensorwise") {
    r.scaling = Fp8Scaling::Tensorwise;
  } else if (recipe == "rowwise") {
    r.scaling = Fp8Scaling::Rowwise;
  } else if (recipe == "delayed") {
    r.scaling = Fp8Scaling::Delayed;
  } else {
    throw fp8::Fp8Error(
        "fp8_recipe: expected \"tensorwise\", \"rowwise\" or \"delayed\", found \"" + recipe +
        "\"");
  }
  if (margin < 0 || margin > 32)
    throw fp8::Fp8Error("fp8_margin: expected an integer in [0, 32], found " +
                        std::to_string(margin));
  r.margin = margin;
  if (history_len < 1 || history_len > 65536)
    throw fp8::Fp8Error("fp8_amax_history_len: expected an integer in [1, 65536], found " +
                        std::to_string(history_len));
  r.amax_history_len = history_len;
  if (algo == "most_recent") {
    r.amax_compute_algo = Fp8AmaxAlgo::MostRecent;
  } else if (algo == "max") {
    r.amax_compute_algo = Fp8AmaxAlgo::Max;
  } else {
    throw fp8::Fp8Error("fp8_amax_compute_algo: expected \"most_recent\" or \"max\", found \"" +
                        algo + "\"");
  }
  return r;
}

}  // namespace dscpp::nn
