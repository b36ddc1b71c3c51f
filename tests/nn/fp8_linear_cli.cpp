// fp8_linear_cli IN OUT RECIPE FORMAT: reads {x, w, b, dy} (a torch.save'd dict), runs
// nn::linear in an Fp8Autocast scope of RECIPE (tensorwise | rowwise) and FORMAT (hybrid |
// e4m3), back-propagates dy, and writes {y, dx, dw, db} to OUT for the Python oracle.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <iostream>

#include "dscpp/nn/fp8_linear.h"
#include "dscpp/nn/linear.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

namespace ck = dscpp::checkpoint;

int main(int argc, char** argv) {
  if (argc != 5) {
    std::cerr << "usage: fp8_linear_cli IN OUT tensorwise|rowwise hybrid|e4m3\n";
    return 2;
  }
  try {
    const ck::PyValue in = ck::load_torch_file(argv[1]);
    auto get = [&](const char* k) { return in.find(ck::PyValue(k))->as_tensor(); };
    at::Tensor x = get("x").clone().requires_grad_(true);
    at::Tensor w = get("w").clone().requires_grad_(true);
    at::Tensor b = get("b").clone().requires_grad_(true);
    at::Tensor y;
    {
      dscpp::nn::Fp8Autocast scope(dscpp::nn::fp8_recipe_from(argv[4], argv[3], 0));
      y = dscpp::nn::linear(x, w, b);
    }
    torch::autograd::backward({y}, {get("dy")});
    ck::PyValue out = ck::PyValue::dict();
    out.set("y", y.detach()).set("dx", x.grad()).set("dw", w.grad()).set("db", b.grad());
    ck::save_torch_file(out, argv[2]);
  } catch (const std::exception& e) {
    std::cerr << "fp8_linear_cli: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
