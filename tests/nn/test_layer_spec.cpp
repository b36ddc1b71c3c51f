// LayerSpec's general form (a tuple activation) beside the one-tensor form, and the aux-loss
// side channel.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/modules/linear.h>

#include "dscpp/error.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/layer_spec.h"

using dscpp::nn::Activation;
using dscpp::nn::LayerSpec;

namespace {

LayerSpec scale_by(double factor) {  // one tensor in, one out
  return {"scale",
          [] { return std::make_shared<torch::nn::Module>(); },
          [factor](torch::nn::Module&, const at::Tensor& x) { return x * factor; },
          "",
          {}};
}

// (x, mask) -> (x * mask + 1, mask): a layer passing a mask along, as DeepSpeed's tuples do.
LayerSpec masked_shift() {
  LayerSpec s{"masked", [] { return std::make_shared<torch::nn::Module>(); }, nullptr, "", {}};
  s.forward_tuple = [](torch::nn::Module&, const Activation& a) {
    return Activation{a[0] * a[1] + 1, a[1]};
  };
  return s;
}

}  // namespace

TEST(LayerSpec, TupleLayersCarryEveryTensorAndOneTensorLayersStillWork) {
  auto layers = dscpp::nn::build_layers({masked_shift(), masked_shift()});
  at::Tensor x = at::tensor({1.0, 2.0, 3.0}), mask = at::tensor({1.0, 0.0, 2.0});
  Activation out = dscpp::nn::run_layers(layers, Activation{x, mask});
  ASSERT_EQ(out.size(), 2u);
  // (x*m+1)*m+1 = {3, 1, 15}
  EXPECT_TRUE(at::equal(out[0], at::tensor({3.0, 1.0, 15.0})));
  EXPECT_TRUE(at::equal(out[1], mask));
  // A one-tensor layer runs in both forms, and refuses a tuple naming itself.
  auto plain = dscpp::nn::build_layers({scale_by(2.0)});
  EXPECT_TRUE(at::equal(dscpp::nn::run_layers(plain, x), x * 2));
  EXPECT_TRUE(at::equal(dscpp::nn::run_layers(plain, Activation{x})[0], x * 2));
  try {
    (void)dscpp::nn::run_layers(plain, Activation{x, mask});
    FAIL() << "a tuple reached a one-tensor layer";
  } catch (const dscpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("layer 'scale' takes one tensor, given 2"),
              std::string::npos)
        << e.what();
  }
}

TEST(AuxLoss, AScopeSumsTheLossesItsLayersAddAndOutsideOneTheyAreRefused) {
  at::Tensor w = at::tensor({2.0}).requires_grad_(true);
  {
    dscpp::nn::AuxLossScope outer;
    dscpp::nn::add_aux_loss((w * 3).sum());
    {
      dscpp::nn::AuxLossScope inner;  // the innermost scope takes what is added inside it
      dscpp::nn::add_aux_loss((w * w).sum());
      EXPECT_DOUBLE_EQ(inner.sum().item<double>(), 4.0);
    }
    dscpp::nn::add_aux_loss((w * 5).sum());
    ASSERT_TRUE(outer.sum().defined());
    EXPECT_DOUBLE_EQ(outer.sum().item<double>(), 16.0);
    outer.sum().backward();
    EXPECT_DOUBLE_EQ(w.grad().item<double>(), 8.0);  // d(3w + 5w)/dw
  }
  EXPECT_THROW(dscpp::nn::add_aux_loss(w.sum()), dscpp::Error);
}
