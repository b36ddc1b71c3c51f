// The MoE permutation kernels against the ATen path (ops::moe_permute with allow_kernels false,
// on the CPU in float64): random routings with and without dropped routes, k = 1, 2, 8, 1 to
// 1024 experts, bf16, fp16 and fp32, hidden sizes on and off the 16-byte paths (and tokens off a
// 16-byte boundary): the same counts, maps and rows (exactly), zero padding rows, the same
// unpermuted output and the same gradients of tokens and weights, with NaN in the padding rows
// of the experts' output. Then that none of it waits on the host (CUDA's sync debug mode, which
// the ATen path trips), and the MoE layer with grouped experts (_grouped_mm on the padded rows)
// against itself on the ATen path, forward and backward. Skips without a GPU.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAFunctions.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <vector>

#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/nn/moe/router.h"
#include "dscpp/nn/moe/token_dispatcher.h"
#include "dscpp/ops/moe_permute.h"
#include "tests/ops/cuda_test_util.h"
#include "tests/ops/kernel_test_util.h"

namespace {

using dscpp::ops::moe_permute;
using dscpp::ops::moe_unpermute;
using dscpp::ops::MoePermutation;
using dscpp::ops::test::placed;
using dscpp::ops::test::rel_err;

struct Case {
  int64_t tokens, hidden, experts, k;
  double keep;  // probability a route is kept (1: dropless)
  at::ScalarType dtype;
  int64_t offset;  // tokens this many elements off a 16-byte boundary
};

double tolerance(at::ScalarType t) {
  return t == at::kFloat ? 1e-5 : t == at::kHalf ? 2e-3 : 1e-2;
}

// k distinct experts per token, and which routes survive.
std::pair<at::Tensor, at::Tensor> routing(const Case& c) {
  at::Tensor indices = std::get<1>(at::rand({c.tokens, c.experts}).topk(c.k, 1));
  at::Tensor kept =
      c.keep >= 1 ? at::ones({c.tokens, c.k}, at::kBool) : at::rand({c.tokens, c.k}).lt(c.keep);
  return {indices, kept};
}

at::Tensor cuda(const at::Tensor& t) {
  return t.to(at::kCUDA);
}

void check_case(const Case& c) {
  SCOPED_TRACE(::testing::Message()
               << "S " << c.tokens << " H " << c.hidden << " E " << c.experts << " k " << c.k
               << " keep " << c.keep << " " << c10::toString(c.dtype) << " offset " << c.offset);
  auto [indices, kept] = routing(c);
  const at::Tensor x = at::randn({c.tokens, c.hidden}).to(c.dtype);  // representable values
  const at::Tensor weights = at::rand({c.tokens, c.k}) * kept.to(at::kFloat);
  // Powers of two: the "expert" multiplies exactly in every dtype, so both paths see one y.
  const at::Tensor scale =
      at::pow(2.0, at::randint(-2, 3, {c.tokens * c.k, c.hidden}).to(at::kDouble));
  const at::Tensor grad = at::randn({c.tokens, c.hidden}).to(c.dtype);

  // The ATen path in float64 on the CPU.
  const at::Tensor x_ref = x.to(at::kDouble).requires_grad_(true);
  const at::Tensor w_ref = weights.clone().requires_grad_(true);
  const MoePermutation ref = moe_permute(x_ref, indices, kept, c.experts, false);
  const int64_t total = ref.rows.size(0);
  const at::Tensor out_ref = moe_unpermute(ref.rows * scale.narrow(0, 0, total), w_ref, ref, false);
  const auto g_ref = torch::autograd::grad({out_ref}, {x_ref, w_ref}, {grad.to(at::kDouble)});

  // The kernels.
  const at::Tensor x_gpu = placed(x, c.offset).requires_grad_(true);
  const at::Tensor w_gpu = cuda(weights).requires_grad_(true);
  const MoePermutation p = moe_permute(x_gpu, cuda(indices), cuda(kept), c.experts);
  ASSERT_TRUE(p.padded);
  ASSERT_EQ(p.rows.size(0), c.tokens * c.k);
  EXPECT_TRUE(at::equal(p.counts.cpu(), ref.counts));
  EXPECT_TRUE(at::equal(p.route_dest.cpu(), ref.route_dest));
  EXPECT_TRUE(at::equal(p.row_route.cpu().narrow(0, 0, total), ref.row_route));
  const int64_t pad = c.tokens * c.k - total;
  EXPECT_TRUE(at::equal(p.row_route.cpu().narrow(0, total, pad), at::full({pad}, -1, at::kLong)));
  EXPECT_TRUE(
      at::equal(p.rows.detach().cpu().narrow(0, 0, total).to(at::kDouble), ref.rows.detach()));
  EXPECT_EQ(p.rows.detach().narrow(0, total, pad).abs().sum().item<double>(), 0.0);

  // The experts' output with NaN in its padding rows (as a grouped GEMM may leave them).
  const at::Tensor valid = p.row_route.ge(0).unsqueeze(1);
  const at::Tensor y = at::where(valid, p.rows * cuda(scale).to(c.dtype), NAN);
  const at::Tensor out = moe_unpermute(y, w_gpu, p);
  EXPECT_EQ(out.scalar_type(), c.dtype);
  EXPECT_LT(rel_err(out, out_ref), tolerance(c.dtype));
  const auto g = torch::autograd::grad({out}, {x_gpu, w_gpu}, {cuda(grad)});
  EXPECT_LT(rel_err(g[0], g_ref[0]), tolerance(c.dtype)) << "d tokens";
  EXPECT_LT(rel_err(g[1], g_ref[1]), tolerance(c.dtype)) << "d weights";
  EXPECT_FALSE(dscpp::ops::test::has_nan(g[0]));
}

TEST(MoePermuteKernels, MatchTheAtenPathOnRandomRoutings) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(20);
  const std::vector<Case> cases = {
      {1, 64, 8, 1, 1.0, at::kBFloat16, 0},       // one token
      {37, 64, 8, 2, 0.7, at::kBFloat16, 0},      // top-2 with drops
      {512, 2048, 64, 8, 0.8, at::kBFloat16, 0},  // the moe_1gpu widths, top-8
      {512, 2048, 64, 8, 1.0, at::kBFloat16, 0},  // dropless
      {300, 100, 16, 2, 0.6, at::kBFloat16, 0},   // 200-byte rows: the word-by-word paths
      {300, 64, 16, 2, 0.6, at::kBFloat16, 3},    // tokens off a 16-byte boundary
      {257, 96, 8, 1, 0.5, at::kHalf, 0},         {257, 96, 8, 8, 0.9, at::kFloat, 0},
      {1000, 64, 1024, 8, 0.9, at::kBFloat16, 0},  // kMoePermuteMaxExperts
      {64, 64, 4, 2, 0.0, at::kBFloat16, 0},       // every route dropped
      {3000, 64, 64, 8, 0.9, at::kFloat, 1},       // many chunks, unaligned fp32
  };
  for (const Case& c : cases) check_case(c);
}

// The counts stay on the device: under CUDA's sync debug mode (L_ERROR: a synchronising call
// throws) the kernels' permute, unpermute and backward run; the ATen path's nonzero throws.
TEST(MoePermuteKernels, NeverWaitOnTheHost) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(21);
  const Case c{256, 64, 16, 2, 0.7, at::kBFloat16, 0};
  auto [indices, kept] = routing(c);
  const at::Tensor ind = cuda(indices), kp = cuda(kept);
  const at::Tensor x = cuda(at::randn({c.tokens, c.hidden})).to(c.dtype).requires_grad_(true);
  const at::Tensor w = cuda(at::rand({c.tokens, c.k})).requires_grad_(true);
  const at::Tensor grad = cuda(at::randn({c.tokens, c.hidden})).to(c.dtype);
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
  bool kernels_ok = true, aten_threw = false;
  try {
    const MoePermutation p = moe_permute(x, ind, kp, c.experts);
    const at::Tensor out = moe_unpermute(p.rows * 2, w, p);
    torch::autograd::grad({out}, {x, w}, {grad});
  } catch (const std::exception& e) {
    kernels_ok = false;
    ADD_FAILURE() << "the kernel path synchronised: " << e.what();
  }
  try {
    moe_permute(x, ind, kp, c.experts, false);
  } catch (const std::exception&) {
    aten_threw = true;
  }
  c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_DISABLED);
  EXPECT_TRUE(kernels_ok);
  EXPECT_TRUE(aten_threw) << "the sync check did not see the ATen path's nonzero";
}

namespace moe = dscpp::nn::moe;

// The MoE layer's gate and grouped experts run twice, once dispatched through the kernels
// (padded rows into _grouped_mm) and once through the ATen path: the same output and the same
// gradients of the input, the gate and both expert weights, bf16 on the GPU.
TEST(MoePermuteKernels, MoeLayerWithGroupedExpertsMatchesTheAtenPath) {
  DSCPP_SKIP_WITHOUT_CUDA();
  at::manual_seed(22);
  for (const int64_t k : {1, 2, 8}) {
    for (const double factor : {1.0, 0.0}) {  // capacity (drops) and dropless
      SCOPED_TRACE(::testing::Message() << "k " << k << " capacity_factor " << factor);
      const int64_t hidden = 64, experts = 8, tokens = 256;
      moe::TopKGate gate(moe::TopKGateOptions(hidden, experts)
                             .k(k)
                             .capacity_factor(factor)
                             .use_rts(false)
                             .top2_2nd_expert_sampling(false));
      moe::GroupedMLP mlp(moe::GroupedMLPOptions(experts, hidden, 128));
      gate->to(at::kCUDA);
      mlp->to(at::kCUDA, at::kBFloat16);
      auto shared_experts = std::static_pointer_cast<torch::nn::Module>(mlp.ptr());
      moe::MOELayer with_kernels(gate, shared_experts,
                                 std::make_unique<moe::LocalTokenDispatcher>(true));
      moe::MOELayer with_aten(gate, shared_experts,
                              std::make_unique<moe::LocalTokenDispatcher>(false));
      const at::Tensor x = cuda(at::randn({tokens, hidden})).to(at::kBFloat16).requires_grad_(true);
      const at::Tensor grad = cuda(at::randn({tokens, hidden})).to(at::kBFloat16);
      const std::vector<at::Tensor> inputs = {x, gate->wg->weight, mlp->weight1, mlp->weight2};
      const at::Tensor a = with_kernels->forward(x, 0).first;
      const auto ga = torch::autograd::grad({a}, inputs, {grad});
      const at::Tensor b = with_aten->forward(x, 0).first;
      const auto gb = torch::autograd::grad({b}, inputs, {grad});
      EXPECT_LT(rel_err(a, b), 1e-2) << "output";
      const char* names[] = {"d input", "d gate", "d weight1", "d weight2"};
      for (size_t i = 0; i < inputs.size(); ++i) {
        EXPECT_LT(rel_err(ga[i], gb[i]), 2e-2) << names[i];
        EXPECT_FALSE(dscpp::ops::test::has_nan(ga[i])) << names[i];
      }
    }
  }
}

}  // namespace
