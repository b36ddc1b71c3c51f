// The MoE layer on one GPU at moe_1gpu's shape (8192 tokens, hidden 2048, 64 experts, top-8,
// expert FFN 1024, GELU, bf16): forward and forward + backward of the router, the dispatch, the
// grouped experts and the combine, with the permutation kernels (ops/moe_permute.h) and with
// the ATen path (index_select / index_add, one host synchronisation: nonzero), with token
// dropping (capacity factor 1.0) and dropless; then the pieces: the grouped experts alone
// (ops::grouped_mm twice, on the kernels' S * k rows) and permute + unpermute alone. Timed as
// bench/kernels_bench.cpp times: CUDA events around each call, the median of --iters after
// --warmup; leaf gradients reset every call. Then the layer as moe_1gpu builds it (SwiGLU experts,
// sigmoid + expert bias, a shared expert) and the router top-k and SwiGLU kernels beside the ATen
// compositions they replace.
//   moe_bench [--tokens 8192] [--hidden 2048] [--experts 64] [--k 8] [--ffn 1024]
//             [--iters 20] [--warmup 5]
//
// Predicted on one H200 (before the first run; bytes at about 3 TB/s, the grouped GEMM at
// the 0.41 ms a product measured before): the grouped experts ~0.9 ms forward, ~2.6 ms forward +
// backward (six products); permute + unpermute with the kernels ~0.2 ms forward, ~0.5 ms
// forward + backward (S * k = 65,536 rows of 4 KiB written and read about four times), with
// ATen ~1 ms and ~2.5 ms (fp32 copies of the rows, atomics in index_add, the nonzero wait);
// the layer ~1.4 / ~3.5 ms with the kernels against ~2.2 / ~5.5 ms with ATen: the grouped
// GEMM about 70% of the kernels' layer.
// Predicted for the router and SwiGLU kernels' rows (before their first run): the router's
// top-k kernel ~0.02 ms forward, ~0.05 ms forward + backward, against ~0.1 / ~0.25 ms for ATen's
// topk, gather, sum, divide and their backward; SwiGLU on [65,536, 2 x 1,024] bf16 ~0.13 ms
// forward (384 MB at ~3 TB/s), ~0.35 ms with backward (1 GB), against eager's ~0.25 / ~0.9 ms
// (two strided kernels forward; four, and the copy into one gradient, backward); moe_1gpu's
// layer (its experts' first product twice as wide as GELU's, plus the shared expert) ~5.5 ms
// forward + backward.
// Predicted for the weight-gradient rows (before their first run; 65,536
// routed rows): _grouped_mm alone ~0.9 ms for [2048, 2048] (550 GFLOP at ~600 TFLOP/s) and
// ~0.45 ms for [1024, 2048]; its add into the slot ~0.35 / ~0.17 ms more (1.6 / 0.8 GB at
// ~4.5 TB/s); cuBLAS's grouped GEMM into the slot within 10% of _grouped_mm alone at beta 0 and
// beta 1 (the slot's read hidden under a compute-bound product): ~0.35 ms a layer's
// micro-batch saved on the wider product.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench/bench_util.h"
#include "dscpp/nn/moe/experts.h"
#include "dscpp/nn/moe/moe.h"
#include "dscpp/nn/moe/router.h"
#include "dscpp/nn/moe/token_dispatcher.h"
#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/grouped_mm.h"
#include "dscpp/ops/grouped_weight_grad.h"
#include "dscpp/ops/moe_permute.h"
#include "dscpp/ops/moe_router.h"

namespace {

namespace moe = dscpp::nn::moe;
using dscpp::bench::parse_int;

struct Options {
  int64_t tokens = 8192, hidden = 2048, experts = 64, k = 8, ffn = 1024;
  int iters = 20, warmup = 5;
};

double median_ms(const std::function<void()>& fn, const Options& o, cudaStream_t stream) {
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<double> ms;
  for (int i = 0; i < o.iters; ++i) {
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    CUDA_CHECK(cudaEventRecord(start, stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop, stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
  }
  std::nth_element(ms.begin(), ms.begin() + o.iters / 2, ms.end());
  return ms[o.iters / 2];
}

// fn's forward alone (no grad) and forward + backward of sum(out * grad) into inputs.
struct Pair {
  double fwd, step;
};

Pair time_pair(const std::function<at::Tensor()>& fn, const std::vector<at::Tensor>& inputs,
               const at::Tensor& grad, const Options& o, cudaStream_t stream) {
  Pair p{};
  {
    const c10::NoGradGuard no_grad;
    p.fwd = median_ms([&] { fn(); }, o, stream);
  }
  p.step = median_ms([&] { torch::autograd::grad({fn()}, inputs, {grad}); }, o, stream);
  return p;
}

void row(const std::string& name, const Pair& p) {
  fmt::print("  {:<46} {:>8.3f} {:>11.3f}\n", name, p.fwd, p.step);
}

// The layer as model_zoo/configs/moe_1gpu.yaml builds it (sigmoid scores with the expert bias,
// dropless, SwiGLU experts, a shared SwiGLU expert of the same width), then its two new kernels
// beside the ATen compositions they replace: the router's top-k on the scores and SwiGLU on the
// experts' S * k rows.
void moe_1gpu_rows(const Options& o, const at::Tensor& x, const at::Tensor& grad,
                   cudaStream_t stream) {
  const auto bf16 = x.options().requires_grad(false);
  moe::MoEOptions mo(o.hidden);
  mo.num_experts(o.experts)
      .k(o.k)
      .capacity_factor(0.0)
      .drop_tokens(false)
      .score_function(moe::ScoreFunction::kSigmoid)
      .enable_expert_bias(true)
      .ffn_hidden_size(o.ffn)
      .activation(moe::Activation::kSwiglu)
      .shared_expert(torch::nn::AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(o.hidden, o.ffn)
                                                             .activation(moe::Activation::kSwiglu)
                                                             .bias(false))));
  moe::MoE layer(mo);
  layer->to(at::kCUDA, at::kBFloat16);
  std::vector<at::Tensor> inputs = {x};
  for (const auto& q : layer->parameters()) inputs.push_back(q);
  fmt::print("moe_1gpu's layer: SwiGLU experts, sigmoid + expert bias, dropless, shared expert\n");
  row("layer (router kernel, SwiGLU kernel)",
      time_pair([&] { return layer->forward(x).output; }, inputs, grad, o, stream));
  const at::Tensor scores =
      at::rand({o.tokens, o.experts}, x.options().dtype(at::kFloat)).requires_grad_(true);
  const at::Tensor bias = at::randn({o.experts}, scores.options()) * 0.01;
  const at::Tensor wgrad = at::randn({o.tokens, o.k}, scores.options());
  for (const bool kernels : {true, false})
    row(fmt::format("router top-k of [{}, {}], {}", o.tokens, o.experts,
                    kernels ? "kernel" : "ATen path"),
        time_pair(
            [&] {
              return dscpp::ops::moe_topk_route(scores, bias, o.k, true, 1.0, kernels).weights;
            },
            {scores}, wgrad, o, stream));
  const at::Tensor h = at::randn({o.tokens * o.k, 2 * o.ffn}, bf16).requires_grad_(true);
  const at::Tensor hgrad = at::randn({o.tokens * o.k, o.ffn}, bf16);
  row(fmt::format("SwiGLU of [{}, 2 x {}], kernel", h.size(0), o.ffn),
      time_pair([&] { return dscpp::ops::swiglu(h); }, {h}, hgrad, o, stream));
  row(fmt::format("SwiGLU of [{}, 2 x {}], eager chunk/silu/mul", h.size(0), o.ffn),
      time_pair(
          [&] {
            const auto halves = h.chunk(2, -1);
            return at::silu(halves[0]) * halves[1];
          },
          {h}, hgrad, o, stream));
}

// The experts' weight gradients of one routing, as the two products of moe_1gpu's experts
// need them (in = hidden, out = 2 x ffn; in = ffn, out = hidden), into a gradient buffer's slot:
// today's ATen product (_grouped_mm, a new tensor) followed by the add autograd's accumulator
// does into the buffer, against cuBLAS's grouped GEMM writing into the slot itself (beta = 1:
// the slot holds earlier micro-batches; beta = 0: the first). Counts on the host, as backward
// has them.
void weight_grad_rows(const Options& o, const at::Tensor& counts, int64_t rows_n,
                      cudaStream_t stream) {
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  const at::Tensor host = counts.to(at::kCPU, at::kLong);
  const std::vector<int64_t> c(host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + host.numel());
  const at::Tensor offs = dscpp::ops::grouped_mm_offsets(counts, counts.device());
  int64_t routed = 0;
  for (int64_t n : c) routed += n;
  fmt::print("experts' weight gradients into the gradient buffer ({} rows routed, {} experts)\n",
             routed, o.experts);
  fmt::print("  {:<46} {:>8} {:>11}\n", "", "ms", "TFLOP/s");
  for (const auto& [in, out] : {std::pair<int64_t, int64_t>{o.hidden, 2 * o.ffn},
                                std::pair<int64_t, int64_t>{o.ffn, o.hidden}}) {
    const at::Tensor rows = at::randn({rows_n, in}, bf16), grad = at::randn({rows_n, out}, bf16);
    at::Tensor slot = at::zeros({o.experts, in, out}, bf16);
    const double tflop = 2.0 * static_cast<double>(routed) * in * out / 1e12;
    auto line = [&](const std::string& name, const std::function<void()>& fn) {
      const double ms = median_ms(fn, o, stream);
      fmt::print("  {:<46} {:>8.3f} {:>11.1f}\n", name, ms, tflop / (ms / 1e3));
    };
    const std::string shape = fmt::format("[{}, {}]", in, out);
    line(shape + " _grouped_mm alone", [&] { at::_grouped_mm(rows.t(), grad, offs); });
    line(shape + " _grouped_mm + add_ into the slot",
         [&] { slot.add_(at::_grouped_mm(rows.t(), grad, offs)); });
    using dscpp::ops::WeightGradKernel;
    for (const auto kernel : {WeightGradKernel::kGrouped, WeightGradKernel::kLoop})
      for (const bool beta1 : {true, false})
        line(
            fmt::format("{} {} into the slot, beta {}", shape,
                        kernel == WeightGradKernel::kGrouped ? "cuBLAS grouped" : "GEMM per expert",
                        beta1 ? 1 : 0),
            [&] { dscpp::ops::grouped_weight_grad_into(slot, rows, grad, c, beta1, kernel); });
  }
}

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    const int64_t v = parse_int(argv[i + 1], argv[i]);
    if (f == "--tokens")
      o.tokens = v;
    else if (f == "--hidden")
      o.hidden = v;
    else if (f == "--experts")
      o.experts = v;
    else if (f == "--k")
      o.k = v;
    else if (f == "--ffn")
      o.ffn = v;
    else if (f == "--iters")
      o.iters = static_cast<int>(std::max<int64_t>(v, 1));
    else if (f == "--warmup")
      o.warmup = static_cast<int>(v);
    else
      throw std::invalid_argument("unknown flag " + f);
  }
  if (at::getNumGPUs() == 0) throw std::runtime_error("no CUDA device");
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto bf16 = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  at::manual_seed(0);
  const at::Tensor x = at::randn({o.tokens, o.hidden}, bf16).requires_grad_(true);
  const at::Tensor grad = at::randn({o.tokens, o.hidden}, bf16);
  fmt::print("MoE layer: {} tokens, hidden {}, {} experts, top-{}, expert FFN {}, GELU, bf16\n",
             o.tokens, o.hidden, o.experts, o.k, o.ffn);
  fmt::print("  {:<46} {:>8} {:>11}\n", "", "fwd ms", "fwd+bwd ms");

  moe::GroupedMLP mlp(moe::GroupedMLPOptions(o.experts, o.hidden, o.ffn));
  mlp->to(at::kCUDA, at::kBFloat16);
  auto experts = std::static_pointer_cast<torch::nn::Module>(mlp.ptr());
  for (const double factor : {1.0, 0.0}) {
    moe::TopKGate gate(moe::TopKGateOptions(o.hidden, o.experts).k(o.k).capacity_factor(factor));
    gate->to(at::kCUDA);
    const std::vector<at::Tensor> inputs = {x, gate->wg->weight, mlp->weight1, mlp->weight2};
    const std::string what = factor > 0 ? "capacity 1.0" : "dropless";
    for (const bool kernels : {true, false}) {
      moe::MOELayer layer(gate, experts, std::make_unique<moe::LocalTokenDispatcher>(kernels));
      row(fmt::format("layer, {}, {}", what, kernels ? "kernels" : "ATen path"),
          time_pair([&] { return layer->forward(x, 0).first; }, inputs, grad, o, stream));
    }
    // The pieces, on one routing of these tokens.
    moe::Routing routing;
    {
      const c10::NoGradGuard no_grad;
      routing = gate->forward(x.detach());
    }
    const at::Tensor w = routing.weights.detach().requires_grad_(true);
    for (const bool kernels : {true, false}) {
      row(fmt::format("permute + unpermute, {}, {}", what, kernels ? "kernels" : "ATen path"),
          time_pair(
              [&] {
                const auto p =
                    dscpp::ops::moe_permute(x, routing.indices, routing.kept, o.experts, kernels);
                return dscpp::ops::moe_unpermute(p.rows, w, p, kernels);
              },
              {x, w}, grad, o, stream));
    }
    const auto p = dscpp::ops::moe_permute(x.detach(), routing.indices, routing.kept, o.experts);
    const at::Tensor rows = p.rows.detach().requires_grad_(true);
    const at::Tensor rows_grad = at::randn(rows.sizes(), bf16);
    row(fmt::format("grouped experts alone, {} ({} rows)", what, rows.size(0)),
        time_pair([&] { return mlp->run_experts(rows, p.counts); },
                  {rows, mlp->weight1, mlp->weight2}, rows_grad, o, stream));
    if (factor == 0.0) weight_grad_rows(o, p.counts, rows.size(0), stream);
  }
  moe_1gpu_rows(o, x, grad, stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dscpp::bench::main_of("moe_bench", run, argc, argv);
}
