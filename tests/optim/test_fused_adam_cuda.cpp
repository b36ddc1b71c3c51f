// The fused CUDA Adam/AdamW kernel against the CPU reference path (the same Optimizer on a
// CPU copy of the shard): odd sizes, shards that start off a 16-byte boundary (so the kernel's
// scalar head/tail and its all-scalar fallback run, not just its float4 body), several steps,
// Adam (L2) and AdamW, bias correction and weight decay on and off. Skips without a GPU.
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/zeros.h>
#include <ATen/ops/zeros_like.h>
#include <c10/cuda/CUDAFunctions.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/fused_adam.h"
#include "dscpp/optim/optimizer.h"
#include "tests/gpu_skip.h"

namespace {

using dscpp::ops::cuda::AdamArgs;
using dscpp::ops::cuda::fused_adam_step;
using dscpp::optim::make_optimizer;
using dscpp::optim::Optimizer;
using nlohmann::json;

const std::vector<int64_t> kSizes = {1, 3, 1001, (int64_t{1} << 20) + 7};
constexpr int kSteps = 4;
constexpr double kTol = 1e-6;
constexpr float kSentinel = 12345.0f;

at::Tensor random_cpu(int64_t n, std::mt19937& rng, float scale) {
  at::Tensor t = at::empty({n}, at::kFloat);
  std::normal_distribution<float> d(0.0f, scale);
  float* p = t.data_ptr<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = d(rng);
  return t;
}

// A CUDA copy of t that starts `offset` elements into a bigger buffer filled with a sentinel
// (so a misaligned shard, and writes outside it show). Returns {slice, buffer}.
std::pair<at::Tensor, at::Tensor> cuda_slice(const at::Tensor& t, int64_t offset) {
  at::Tensor buf = at::full({t.numel() + offset + 5}, kSentinel,
                            at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
  at::Tensor s = buf.narrow(0, offset, t.numel());
  s.copy_(t);
  return {s, buf};
}

// max |got - want| / max |want|.
double rel_err(const at::Tensor& got, const at::Tensor& want) {
  at::Tensor g = got.cpu();
  const double diff = g.sub(want).abs().max().item<double>();
  const double scale = want.abs().max().item<double>();
  return diff / std::max(scale, 1e-30);
}

void expect_untouched_outside(const at::Tensor& buf, int64_t offset, int64_t n,
                              const std::string& what) {
  at::Tensor b = buf.cpu();
  const float* d = b.data_ptr<float>();
  for (int64_t i = 0; i < b.numel(); ++i) {
    if (i < offset || i >= offset + n) {
      ASSERT_EQ(d[i], kSentinel) << what << ": element " << i << " outside the shard changed";
    }
  }
}

struct Case {
  std::string type;  // "adam" (L2 decay) or "adamw" (decoupled)
  bool bias_correction;
  double weight_decay;
  std::string label() const {
    return fmt::format("{} bias_correction={} weight_decay={}", type, bias_correction,
                       weight_decay);
  }
  json params() const {
    json p = {{"lr", 1e-2},
              {"betas", {0.9, 0.999}},
              {"eps", 1e-8},
              {"weight_decay", weight_decay},
              {"bias_correction", bias_correction}};
    if (type == "adam") p["adam_w_mode"] = false;
    return p;
  }
  AdamArgs args(int64_t step) const {
    AdamArgs a;
    a.lr = 1e-2;
    a.beta1 = 0.9;
    a.beta2 = 0.999;
    a.eps = 1e-8;
    a.weight_decay = weight_decay;
    a.step = step;
    a.bias_correction = bias_correction;
    a.adam_w_mode = type == "adamw";
    return a;
  }
};

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* type : {"adam", "adamw"})
    for (bool bc : {true, false})
      for (double wd : {0.0, 0.05}) cases.push_back({type, bc, wd});
  return cases;
}

std::unique_ptr<Optimizer> make(const Case& c) {
  dscpp::OptimizerConfig cfg;
  cfg.type = c.type;
  cfg.params = c.params();
  return make_optimizer(cfg);
}

// The Optimizer on a CUDA shard (the fused kernel) against the same Optimizer on a CPU copy.
TEST(FusedAdamCuda, OptimizerOnGpuMatchesCpuPath) {
  DSCPP_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(1234);
  for (const Case& c : all_cases())
    for (int64_t n : kSizes)
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(fmt::format("{} numel={} offset={}", c.label(), n, offset));
        at::Tensor p0 = random_cpu(n, rng, 1.0f);
        auto cpu = make(c);
        auto gpu = make(c);
        ASSERT_EQ(cpu->name(), gpu->name());
        cpu->add_shard(p0.clone());
        auto [gp, gp_buf] = cuda_slice(p0, offset);
        gpu->add_shard(gp);
        for (int step = 1; step <= kSteps; ++step) {
          at::Tensor g = random_cpu(n, rng, 0.1f);
          auto [gg, gg_buf] = cuda_slice(g, offset);
          cpu->step({g});
          gpu->step({gg});
        }
        EXPECT_LT(rel_err(gpu->shard(0), cpu->shard(0)), kTol) << "param";
        EXPECT_LT(rel_err(gpu->state(0).at("exp_avg"), cpu->state(0).at("exp_avg")), kTol)
            << "exp_avg";
        EXPECT_LT(rel_err(gpu->state(0).at("exp_avg_sq"), cpu->state(0).at("exp_avg_sq")), kTol)
            << "exp_avg_sq";
        EXPECT_GT(cpu->shard(0).sub(p0).abs().max().item<double>(), 0.0) << "no update at all";
        expect_untouched_outside(gp_buf, offset, n, "param buffer");
      }
}

// fused_adam_step directly, with all four tensors at chosen offsets: equal offsets run the
// scalar head + float4 body + scalar tail, mixed ones the all-scalar fallback.
TEST(FusedAdamCuda, KernelMatchesCpuPathAtEveryAlignment) {
  DSCPP_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(99);
  const std::vector<std::vector<int64_t>> offsets = {{0, 0, 0, 0}, {1, 1, 1, 1}, {2, 2, 2, 2},
                                                     {3, 3, 3, 3}, {1, 0, 2, 3}, {0, 1, 0, 0}};
  for (const Case& c :
       {Case{"adamw", true, 0.05}, Case{"adam", true, 0.05}, Case{"adamw", false, 0.0}})
    for (int64_t n : kSizes)
      for (const auto& off : offsets) {
        SCOPED_TRACE(fmt::format("{} numel={} offsets=[{},{},{},{}]", c.label(), n, off[0], off[1],
                                 off[2], off[3]));
        at::Tensor p0 = random_cpu(n, rng, 1.0f);
        auto cpu = make(c);
        cpu->add_shard(p0.clone());
        auto [p, p_buf] = cuda_slice(p0, off[0]);
        auto [m, m_buf] = cuda_slice(at::zeros({n}, at::kFloat), off[2]);
        auto [v, v_buf] = cuda_slice(at::zeros({n}, at::kFloat), off[3]);
        for (int step = 1; step <= kSteps; ++step) {
          at::Tensor g = random_cpu(n, rng, 0.1f);
          auto [gg, gg_buf] = cuda_slice(g, off[1]);
          cpu->step({g});
          fused_adam_step(p, gg, m, v, c.args(step));
        }
        EXPECT_LT(rel_err(p, cpu->shard(0)), kTol) << "param";
        EXPECT_LT(rel_err(m, cpu->state(0).at("exp_avg")), kTol) << "exp_avg";
        EXPECT_LT(rel_err(v, cpu->state(0).at("exp_avg_sq")), kTol) << "exp_avg_sq";
        expect_untouched_outside(p_buf, off[0], n, "param buffer");
        expect_untouched_outside(m_buf, off[2], n, "exp_avg buffer");
        expect_untouched_outside(v_buf, off[3], n, "exp_avg_sq buffer");
      }
}

// The 16-bit copy the kernel writes from its registers must be the updated fp32 parameters
// rounded exactly as Tensor::to() rounds them, at every alignment of the copy (a copy whose
// offset differs from the others' sends the whole update down the scalar path), for bf16 and
// fp16, and must leave the copy's buffer untouched outside its range.
TEST(FusedAdamCuda, ParamCopyIsTheUpdateRoundedAsTensorTo) {
  DSCPP_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(5);
  for (at::ScalarType type : {at::kBFloat16, at::kHalf})
    for (int64_t n : kSizes)
      for (int64_t copy_off : {0, 1, 2, 3}) {
        SCOPED_TRACE(fmt::format("{} numel={} copy offset {}", c10::toString(type), n, copy_off));
        auto [p, p_buf] = cuda_slice(random_cpu(n, rng, 1.0f), 0);
        auto [m, m_buf] = cuda_slice(at::zeros({n}, at::kFloat), 0);
        auto [v, v_buf] = cuda_slice(at::zeros({n}, at::kFloat), 0);
        at::Tensor q_buf = at::full({n + 8}, 7.0, p.options().dtype(type));
        at::Tensor q = q_buf.slice(0, copy_off, copy_off + n);
        for (int step = 1; step <= kSteps; ++step) {
          auto [g, g_buf] = cuda_slice(random_cpu(n, rng, 0.1f), 0);
          AdamArgs a = Case{"adamw", true, 0.05}.args(step);
          a.param_copy = &q;
          fused_adam_step(p, g, m, v, a);
          ASSERT_TRUE(at::equal(q, p.to(type))) << "step " << step;
        }
        const at::Tensor outside =
            at::cat({q_buf.slice(0, 0, copy_off), q_buf.slice(0, copy_off + n)});
        EXPECT_TRUE(at::equal(outside, at::full_like(outside, 7.0))) << "copy buffer";
      }
}

TEST(FusedAdamCuda, RejectsTensorsItCannotUpdate) {
  DSCPP_SKIP_WITHOUT_CUDA();
  const auto cuda = at::TensorOptions().dtype(at::kFloat).device(at::kCUDA);
  at::Tensor p = at::zeros({16}, cuda), g = at::zeros({16}, cuda);
  at::Tensor m = at::zeros({16}, cuda), v = at::zeros({16}, cuda);
  AdamArgs a;
  at::Tensor cpu_g = at::zeros({16}, at::kFloat);
  EXPECT_THROW(fused_adam_step(p, cpu_g, m, v, a), dscpp::Error);
  at::Tensor short_m = at::zeros({15}, cuda);
  EXPECT_THROW(fused_adam_step(p, g, short_m, v, a), dscpp::Error);
  at::Tensor dbl_v = at::zeros({16}, cuda.dtype(at::kDouble));
  EXPECT_THROW(fused_adam_step(p, g, m, dbl_v, a), dscpp::Error);
  at::Tensor strided = at::zeros({32}, cuda).slice(0, 0, 32, 2);
  EXPECT_THROW(fused_adam_step(strided, g, m, v, a), dscpp::Error);
  a.step = 0;
  EXPECT_THROW(fused_adam_step(p, g, m, v, a), dscpp::Error);
  a.step = 1;
  at::Tensor fp32_copy = at::zeros({16}, cuda),
             short_copy = at::zeros({15}, cuda.dtype(at::kBFloat16));
  a.param_copy = &fp32_copy;
  EXPECT_THROW(fused_adam_step(p, g, m, v, a), dscpp::Error);
  a.param_copy = &short_copy;
  EXPECT_THROW(fused_adam_step(p, g, m, v, a), dscpp::Error);
  a.param_copy = nullptr;
  EXPECT_NO_THROW(fused_adam_step(p, g, m, v, a));
  at::Tensor empty = at::zeros({0}, cuda);
  EXPECT_NO_THROW(fused_adam_step(empty, empty, empty, empty, a));
}

// grad_scale read on the device gives the same bits as multiplying the gradient first (one
// float rounding either way), at the vectorised body's sizes and the scalar tail's.
TEST(FusedAdamCuda, DeviceGradScaleEqualsPremultipliedGradient) {
  DSCPP_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(7);
  for (int64_t n : {int64_t{5}, (int64_t{1} << 16) + 3}) {
    at::Tensor p0 = random_cpu(n, rng, 1.0f), g = random_cpu(n, rng, 3.0f);
    at::Tensor scale = at::full({}, 0.37f, at::TensorOptions().dtype(at::kFloat)).cuda();
    AdamArgs a;
    a.weight_decay = 0.1;
    at::Tensor pa = p0.cuda(), ma = at::zeros_like(pa), va = at::zeros_like(pa);
    at::Tensor pb = p0.cuda(), mb = at::zeros_like(pb), vb = at::zeros_like(pb);
    at::Tensor gcuda = g.cuda();
    at::Tensor pre = at::mul(gcuda, scale);
    fused_adam_step(pa, pre, ma, va, a);
    a.grad_scale = &scale;
    fused_adam_step(pb, gcuda, mb, vb, a);
    EXPECT_TRUE(at::equal(pa, pb)) << "n=" << n;
    EXPECT_TRUE(at::equal(ma, mb)) << "n=" << n;
    EXPECT_TRUE(at::equal(va, vb)) << "n=" << n;
  }
}

// A non-finite scale is an overflow's verdict, taken on the device: the update is skipped
// (param and moments unchanged, bit for bit, after real steps have made the moments nonzero)
// and the 16-bit copy is the unchanged param rounded as Tensor::to rounds.
TEST(FusedAdamCuda, NonFiniteScaleSkipsTheUpdateAndCopiesTheParam) {
  DSCPP_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(11);
  const float verdicts[] = {std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  for (int64_t n : kSizes)
    for (float verdict : verdicts) {
      SCOPED_TRACE(fmt::format("numel={} scale {}", n, verdict));
      at::Tensor p = random_cpu(n, rng, 1.0f).cuda(), m = at::zeros_like(p), v = at::zeros_like(p);
      AdamArgs a = Case{"adamw", true, 0.05}.args(1);
      fused_adam_step(p, random_cpu(n, rng, 0.1f).cuda(), m, v, a);
      const at::Tensor p0 = p.clone(), m0 = m.clone(), v0 = v.clone();
      at::Tensor scale = at::full({}, verdict, p.options());
      at::Tensor q = at::full({n}, 7.0, p.options().dtype(at::kBFloat16));
      a = Case{"adamw", true, 0.05}.args(2);
      a.grad_scale = &scale;
      a.param_copy = &q;
      fused_adam_step(p, random_cpu(n, rng, 0.1f).cuda(), m, v, a);
      EXPECT_TRUE(at::equal(p, p0));
      EXPECT_TRUE(at::equal(m, m0));
      EXPECT_TRUE(at::equal(v, v0));
      EXPECT_TRUE(at::equal(q, p0.to(at::kBFloat16)));
    }
}

// A bf16 or fp16 gradient (ZeRO's 16-bit partition) read by the kernel itself gives the same
// moments, bit for bit, as widening it to fp32 first, at every alignment of the gradient
// against the other three (a 16-bit gradient vectorises when it sits at the same element
// offset) and with the device-side scale. The parameter agrees to kTol, not to the bit: nvcc
// contracts the decay and the step's add into an fma in one instantiation and not the other
// (measured on an H200: at most 7.2e-7 apart on parameters up to about 5, a rounding or two).
TEST(FusedAdamCuda, SixteenBitGradientEqualsItsFp32Copy) {
  DSCPP_SKIP_WITHOUT_CUDA();
  std::mt19937 rng(11);
  const int64_t n = (int64_t{1} << 14) + 7;
  at::Tensor scale = at::full({}, 0.37f, at::TensorOptions().dtype(at::kFloat)).cuda();
  for (const auto dtype : {at::kBFloat16, at::kHalf})
    for (int64_t p_off : {0, 1, 3})
      for (int64_t g_off : {0, 1, 2, 3}) {
        SCOPED_TRACE(
            fmt::format("{} param offset {} grad offset {}", c10::toString(dtype), p_off, g_off));
        at::Tensor p0 = random_cpu(n, rng, 1.0f);
        at::Tensor g16 = random_cpu(n + g_off, rng, 2.0f).to(dtype).cuda().slice(0, g_off);
        AdamArgs a;
        a.weight_decay = 0.1;
        a.grad_scale = &scale;
        at::Tensor pa = p0.cuda(), ma = at::zeros_like(pa), va = at::zeros_like(pa);
        at::Tensor buf = at::zeros({n + p_off}, pa.options());
        at::Tensor pb = buf.slice(0, p_off).copy_(p0);
        at::Tensor mbuf = at::zeros_like(buf), vbuf = at::zeros_like(buf);
        at::Tensor mb = mbuf.slice(0, p_off), vb = vbuf.slice(0, p_off);
        for (int step = 1; step <= 2; ++step) {
          a.step = step;
          fused_adam_step(pa, g16.to(at::kFloat), ma, va, a);
          fused_adam_step(pb, g16, mb, vb, a);
        }
        const auto diff = [](const at::Tensor& x, const at::Tensor& y) {
          return x.sub(y).abs().max().item<double>();
        };
        EXPECT_LT(rel_err(pb, pa.cpu()), kTol) << "param: max difference " << diff(pa, pb);
        EXPECT_TRUE(at::equal(ma, mb)) << "exp_avg: max difference " << diff(ma, mb);
        EXPECT_TRUE(at::equal(va, vb)) << "exp_avg_sq: max difference " << diff(va, vb);
        EXPECT_FALSE(at::equal(pa, p0.cuda())) << "no update at all";
      }
  at::Tensor p = at::zeros({8}, scale.options()), m = at::zeros_like(p), v = at::zeros_like(p);
  at::Tensor bf16_param = at::zeros({8}, scale.options().dtype(at::kBFloat16));
  AdamArgs a;
  EXPECT_THROW(fused_adam_step(bf16_param, p, m, v, a), dscpp::Error) << "fp32 param only";
}

}  // namespace
