// The fused ops (ops) against the eager ATen compositions they replace, at the GPT
// 1.3B's shapes on one GPU: bias_gelu on [tokens, ffn] bf16 vs gelu(x + bias), cross_entropy
// on [tokens, vocab] bf16 logits vs cross_entropy_loss(logits.float()), add_layer_norm on
// [tokens, hidden] bf16 vs the add then layer_norm (both outputs used, as in a block). Each
// variant runs
// forward, and forward + backward through autograd (leaf grads reset every time, so nothing
// accumulates), timed one call at a time by CUDA events on the current stream: the median of
// --iters after --warmup. GB/s counts the minimal bytes of the op (what the fused kernels
// move), the same for both variants, so it reads as effective bandwidth; the device-to-device
// copy line is the bandwidth there is. "its kernels alone" calls the fused op's two halves
// without autograd (the difference to the line above is the wrapper's cost). For
// cross-entropy, each variant's peak allocation in one forward + backward above what was
// allocated before it. For add_layer_norm also the backward alone (autograd on a kept graph)
// and GB/s from each variant's own bytes moved.
// grouped_mm: the local experts' grouped GEMM against its loop and one dense product.
//   kernels_bench [--tokens 8192] [--ffn 8192] [--hidden 2048] [--vocab 50304] [--gelu tanh|none]
//                 [--iters 20] [--warmup 5] [--device 0] [--experts 64] [--moe-rows 65536]
//                 [--moe-ffn 1024]
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/layer_norm.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "dscpp/ops/fused_ops.h"
#include "dscpp/ops/grouped_mm.h"
#include "dscpp/ops/kernel_launch.h"
#include "dscpp/ops/ops_impl.h"

namespace {

using dscpp::bench::parse_int;

struct Options {
  int64_t tokens = 8192;  // micro-batch 8 x seq 1024
  int64_t ffn = 8192;
  int64_t hidden = 2048;
  int64_t vocab = 50304;
  bool tanh = true;  // the GPT configs' gelu_approximation
  int iters = 20;
  int warmup = 5;
  int device = 0;
  int64_t experts = 64;      // grouped_mm: local experts,
  int64_t moe_rows = 65536;  // routed token rows (split evenly),
  int64_t moe_ffn = 1024;    // hidden -> moe_ffn (the MoE GPT of one GPU's shapes)
};

// The median over `iters` calls of fn's GPU time, each call between its own pair of events
// (host launch gaps inside a call count; those between calls do not).
double median_ms(const std::function<void()>& fn, const Options& o, cudaStream_t stream) {
  for (int i = 0; i < o.warmup; ++i) fn();
  std::vector<cudaEvent_t> start(o.iters), stop(o.iters);
  for (int i = 0; i < o.iters; ++i) {
    CUDA_CHECK(cudaEventCreate(&start[i]));
    CUDA_CHECK(cudaEventCreate(&stop[i]));
  }
  for (int i = 0; i < o.iters; ++i) {
    CUDA_CHECK(cudaEventRecord(start[i], stream));
    fn();
    CUDA_CHECK(cudaEventRecord(stop[i], stream));
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<double> ms(o.iters);
  for (int i = 0; i < o.iters; ++i) {
    float t = 0;
    CUDA_CHECK(cudaEventElapsedTime(&t, start[i], stop[i]));
    ms[i] = t;
    CUDA_CHECK(cudaEventDestroy(start[i]));
    CUDA_CHECK(cudaEventDestroy(stop[i]));
  }
  std::nth_element(ms.begin(), ms.begin() + o.iters / 2, ms.end());
  return ms[o.iters / 2];
}

// Bytes above what was allocated before, at the peak of one call of fn.
double peak_gib(const std::function<void()>& fn, c10::DeviceIndex device) {
  namespace alloc = c10::cuda::CUDACachingAllocator;
  CUDA_CHECK(cudaDeviceSynchronize());
  alloc::resetPeakStats(device);
  const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const int64_t before = alloc::getDeviceStats(device).allocated_bytes[agg].current;
  fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  const int64_t peak = alloc::getDeviceStats(device).allocated_bytes[agg].peak;
  return static_cast<double>(peak - before) / (1 << 30);
}

struct Timing {
  double fwd_ms, step_ms;  // forward; forward + backward
};

void print_header() {
  fmt::print("  {:<34} {:>9} {:>9} {:>11} {:>9}\n", "", "fwd ms", "fwd GB/s", "fwd+bwd ms", "GB/s");
}

void print_row(const std::string& name, const Timing& t, double fwd_bytes, double step_bytes) {
  fmt::print("  {:<34} {:>9.3f} {:>9.0f} {:>11.3f} {:>9.0f}\n", name, t.fwd_ms,
             fwd_bytes / (t.fwd_ms * 1e-3) / 1e9, t.step_ms, step_bytes / (t.step_ms * 1e-3) / 1e9);
}

void print_ratio(const Timing& fused, const Timing& eager) {
  fmt::print("  fused vs eager: forward {:.2f}x, forward+backward {:.2f}x the speed\n",
             eager.fwd_ms / fused.fwd_ms, eager.step_ms / fused.step_ms);
}

double copy_gbps(const Options& o, const at::TensorOptions& opts, cudaStream_t stream) {
  const int64_t bytes = int64_t{1} << 30;
  at::Tensor src = at::empty({bytes}, opts.dtype(at::kByte)).fill_(1);
  at::Tensor dst = at::empty({bytes}, opts.dtype(at::kByte));
  const double ms = median_ms([&] { dst.copy_(src); }, o, stream);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

void bench_bias_gelu(const Options& o, const at::TensorOptions& opts, cudaStream_t stream) {
  const auto bf16 = opts.dtype(at::kBFloat16);
  const at::Tensor x = at::randn({o.tokens, o.ffn}, bf16).requires_grad_();
  const at::Tensor b = at::randn({o.ffn}, bf16).mul_(0.1).requires_grad_();
  const at::Tensor g = at::randn({o.tokens, o.ffn}, bf16);
  const char* approximate = o.tanh ? "tanh" : "none";
  const auto reset = [&] {
    x.mutable_grad() = at::Tensor();
    b.mutable_grad() = at::Tensor();
  };
  const auto fused = [&] { return dscpp::ops::bias_gelu(x, b, o.tanh); };
  const auto eager = [&] { return at::gelu(x.add(b), approximate); };
  const auto time = [&](const std::function<at::Tensor()>& f) {
    Timing t{};
    t.fwd_ms = median_ms([&] { f(); }, o, stream);
    t.step_ms = median_ms(
        [&] {
          f().backward(g);
          reset();
        },
        o, stream);
    return t;
  };
  // Minimal traffic, bf16: forward reads x, writes y; backward reads grad and x, writes dx.
  const double mn = static_cast<double>(o.tokens) * static_cast<double>(o.ffn);
  const double fwd_bytes = 2 * 2 * mn, step_bytes = 2 * 5 * mn;
  fmt::print("\nbias_gelu: x [{}, {}] bf16, bias [{}], gelu {}\n", o.tokens, o.ffn, o.ffn,
             approximate);
  print_header();
  const Timing tf = time(fused);
  print_row("fused dscpp::ops::bias_gelu", tf, fwd_bytes, step_bytes);
  // The same two halves called directly: what the autograd wrapper adds is the difference.
  {
    namespace detail = dscpp::ops::detail;
    const c10::NoGradGuard no_grad;
    Timing tk{};
    tk.fwd_ms = median_ms([&] { detail::bias_gelu_forward(x, b, o.tanh); }, o, stream);
    tk.step_ms = median_ms(
        [&] {
          detail::bias_gelu_forward(x, b, o.tanh);
          detail::bias_gelu_backward(g, x, b, o.tanh, true, true);
        },
        o, stream);
    print_row("  its kernels alone (no autograd)", tk, fwd_bytes, step_bytes);
  }
  const Timing te = time(eager);
  print_row("eager gelu(x + bias)", te, fwd_bytes, step_bytes);
  print_ratio(tf, te);
  fmt::print(
      "  predicted from bytes moved: forward 2.00x (8 vs 4 bytes an element), "
      "forward+backward 1.60x (16 vs 10)\n");
}

// Forward, backward and forward + backward apart, each with the GB/s of its own variant's bytes
// moved (so each reads against the copy line), for add_layer_norm.
struct Timing3 {
  double fwd_ms, bwd_ms, step_ms;
};

void print_row3(const std::string& name, const Timing3& t, const std::array<double, 3>& bytes) {
  const auto gbps = [](double b, double ms) { return b / (ms * 1e-3) / 1e9; };
  fmt::print("  {:<34} {:>8.3f} {:>6.0f} {:>8.3f} {:>6.0f} {:>9.3f} {:>6.0f}\n", name, t.fwd_ms,
             gbps(bytes[0], t.fwd_ms), t.bwd_ms, gbps(bytes[1], t.bwd_ms), t.step_ms,
             gbps(bytes[2], t.step_ms));
}

void bench_add_layer_norm(const Options& o, const at::TensorOptions& opts, cudaStream_t stream) {
  namespace detail = dscpp::ops::detail;
  const auto bf16 = opts.dtype(at::kBFloat16);
  const int64_t n = o.hidden;
  const at::Tensor x = at::randn({o.tokens, n}, bf16).requires_grad_();
  const at::Tensor br = at::randn({o.tokens, n}, bf16).requires_grad_();
  const at::Tensor w = at::randn({n}, bf16).mul_(0.1).add_(1.0).requires_grad_();
  const at::Tensor b = at::randn({n}, bf16).mul_(0.1).requires_grad_();
  const at::Tensor gh = at::randn({o.tokens, n}, bf16), gy = at::randn({o.tokens, n}, bf16);
  const double eps = 1e-5;
  const auto reset = [&] {
    for (const at::Tensor* t : {&x, &br, &w, &b}) t->mutable_grad() = at::Tensor();
  };
  using Pair = std::array<at::Tensor, 2>;
  const auto fused = [&] { return dscpp::ops::add_layer_norm(x, br, w, b, eps); };
  const auto eager = [&] {
    at::Tensor h = x.add(br);
    return Pair{h, at::layer_norm(h, {n}, w, b, eps)};
  };
  // Backward alone: through autograd on one forward's graph, kept (retain_graph) for every call.
  const auto time = [&](const std::function<Pair()>& f) {
    Timing3 t{};
    t.fwd_ms = median_ms([&] { f(); }, o, stream);
    {
      const Pair hy = f();
      t.bwd_ms = median_ms(
          [&] {
            torch::autograd::backward({hy[0], hy[1]}, {gh, gy}, /*retain_graph=*/true);
            reset();
          },
          o, stream);
    }
    t.step_ms = median_ms(
        [&] {
          const Pair hy = f();
          torch::autograd::backward({hy[0], hy[1]}, {gh, gy});
          reset();
        },
        o, stream);
    return t;
  };
  // Bytes moved, bf16 tensors of [tokens, hidden]: the fused forward reads x and branch, writes
  // h and y (4); its backward reads dy, dh, h, writes dx (4; x and branch share it) plus the
  // fp32 partial sums of dweight and dbias written and read once. Eager moves 5 forward (the
  // add's 3, layer_norm's 2) and 8 backward (layer_norm's input gradient 3, its weight
  // gradients 2, the sum of h's two gradients 3).
  const double tensor = 2.0 * static_cast<double>(o.tokens) * static_cast<double>(n);
  const c10::cuda::CUDAGuard guard(x.device());
  const double partial_bytes =
      2.0 * 4.0 *
      static_cast<double>(dscpp::ops::cuda::add_layer_norm_backward_workspace(o.tokens, n));
  const std::array<double, 3> fused_bytes = {4 * tensor, 4 * tensor + partial_bytes,
                                             8 * tensor + partial_bytes};
  const std::array<double, 3> eager_bytes = {5 * tensor, 8 * tensor, 13 * tensor};
  fmt::print("\nadd_layer_norm: x, branch [{}, {}] bf16, weight and bias [{}]\n", o.tokens, n, n);
  fmt::print("  {:<34} {:>8} {:>6} {:>8} {:>6} {:>9} {:>6}   (GB/s: each variant's own bytes)\n",
             "", "fwd ms", "GB/s", "bwd ms", "GB/s", "f+b ms", "GB/s");
  const Timing3 tf = time(fused);
  print_row3("fused dscpp::ops::add_layer_norm", tf, fused_bytes);
  {
    const c10::NoGradGuard no_grad;
    Timing3 tk{};
    tk.fwd_ms = median_ms([&] { detail::add_layer_norm_forward(x, br, w, b, eps); }, o, stream);
    const detail::AddLayerNormForward f = detail::add_layer_norm_forward(x, br, w, b, eps);
    tk.bwd_ms = median_ms(
        [&] {
          detail::add_layer_norm_backward(gh, gy, f.h, w, b, f.mean, f.rstd, {true, true, true});
        },
        o, stream);
    tk.step_ms = median_ms(
        [&] {
          const detail::AddLayerNormForward g = detail::add_layer_norm_forward(x, br, w, b, eps);
          detail::add_layer_norm_backward(gh, gy, g.h, w, b, g.mean, g.rstd, {true, true, true});
        },
        o, stream);
    print_row3("  its kernels alone (no autograd)", tk, fused_bytes);
  }
  const Timing3 te = time(eager);
  print_row3("eager x + branch, layer_norm", te, eager_bytes);
  fmt::print(
      "  fused vs eager: forward {:.2f}x, backward {:.2f}x, forward+backward {:.2f}x the speed\n",
      te.fwd_ms / tf.fwd_ms, te.bwd_ms / tf.bwd_ms, te.step_ms / tf.step_ms);
  fmt::print(
      "  predicted from bytes moved: forward 1.25x (5 vs 4 tensors), backward ~1.9x (8 vs 4 + "
      "partials), forward+backward ~1.6x (13 vs 8 + partials); at 4 TB/s the fused backward "
      "takes {:.3f} ms\n",
      fused_bytes[1] / 4e12 * 1e3);
  fmt::print("  per step, 24 blocks: fused {:.2f} ms, eager {:.2f} ms\n", 24 * tf.step_ms,
             24 * te.step_ms);
}

void bench_cross_entropy(const Options& o, const at::TensorOptions& opts, cudaStream_t stream) {
  const auto bf16 = opts.dtype(at::kBFloat16);
  const at::Tensor logits = at::randn({o.tokens, o.vocab}, bf16).mul_(3).requires_grad_();
  const at::Tensor targets = at::randint(o.vocab, {o.tokens}, opts.dtype(at::kLong));
  const auto fused = [&] { return dscpp::ops::cross_entropy(logits, targets); };
  const auto eager = [&] { return at::cross_entropy_loss(logits.to(at::kFloat), targets); };
  const auto step = [&](const std::function<at::Tensor()>& f) {
    f().backward();
    logits.mutable_grad() = at::Tensor();
  };
  const auto time = [&](const std::function<at::Tensor()>& f) {
    Timing t{};
    t.fwd_ms = median_ms([&] { f(); }, o, stream);
    t.step_ms = median_ms([&] { step(f); }, o, stream);
    return t;
  };
  const double nv = static_cast<double>(o.tokens) * static_cast<double>(o.vocab);
  // Minimal traffic, bf16: forward reads the logits; backward reads them, writes dlogits.
  const double fwd_bytes = 2 * nv, step_bytes = 2 * 3 * nv;
  fmt::print("\ncross_entropy: logits [{}, {}] bf16 ({:.2f} GiB)\n", o.tokens, o.vocab,
             2 * nv / (1 << 30));
  const double lf = fused().item<double>(), le = eager().item<double>();
  fmt::print("  loss: fused {:.6f}, eager {:.6f} (relative difference {:.1e})\n", lf, le,
             std::abs(lf - le) / std::abs(le));
  print_header();
  const Timing tf = time(fused);
  print_row("fused dscpp::ops::cross_entropy", tf, fwd_bytes, step_bytes);
  {
    namespace detail = dscpp::ops::detail;
    const c10::NoGradGuard no_grad;
    const at::Tensor one = at::ones({}, opts.dtype(at::kFloat));
    Timing tk{};
    tk.fwd_ms = median_ms([&] { detail::cross_entropy_forward(logits, targets, -100); }, o, stream);
    tk.step_ms = median_ms(
        [&] {
          const auto f = detail::cross_entropy_forward(logits, targets, -100);
          detail::cross_entropy_backward(one, logits, targets, f.lse, f.count, -100);
        },
        o, stream);
    print_row("  its kernels alone (no autograd)", tk, fwd_bytes, step_bytes);
  }
  const Timing te = time(eager);
  print_row("eager cross_entropy_loss(x.float())", te, fwd_bytes, step_bytes);
  print_ratio(tf, te);
  fmt::print(
      "  predicted from bytes moved: forward ~7x (14 vs 2 bytes an element), "
      "forward+backward ~6x (36 vs 6)\n");
  const auto device = static_cast<c10::DeviceIndex>(o.device);
  const double pf = peak_gib([&] { step(fused); }, device);
  const double pe = peak_gib([&] { step(eager); }, device);
  fmt::print(
      "  peak memory above the logits, forward+backward: fused {:.2f} GiB, eager {:.2f} GiB "
      "(predicted: fused 1.00x the bf16 logits = {:.2f} GiB, eager ~6x)\n",
      pf, pe, 2 * nv / (1 << 30));
}

// ops::grouped_mm (ATen's _grouped_mm) against the loop of products it replaces and against
// one dense product of the same FLOPs: [moe_rows, hidden] in `experts` equal groups times
// [experts, hidden, moe_ffn], bf16. Also forward + backward through autograd, and the largest
// difference to the loop (DESIGN measured bit-equal).
void bench_grouped_mm(const Options& o, const at::TensorOptions& opts, cudaStream_t stream) {
  const auto bf16 = opts.dtype(at::kBFloat16);
  const int64_t per = o.moe_rows / o.experts, rows_n = per * o.experts;
  const at::Tensor rows = at::randn({rows_n, o.hidden}, bf16).requires_grad_();
  const at::Tensor w =
      at::randn({o.experts, o.hidden, o.moe_ffn}, bf16).mul_(0.02).requires_grad_();
  const at::Tensor counts = at::full({o.experts}, per, opts.dtype(at::kLong));
  const at::Tensor dense_w = at::randn({o.hidden, o.moe_ffn}, bf16);
  const at::Tensor grad = at::randn({rows_n, o.moe_ffn}, bf16);
  const double flop = 2.0 * static_cast<double>(rows_n) * o.hidden * o.moe_ffn;
  auto tflops = [&](double ms) { return flop / (ms * 1e-3) / 1e12; };
  fmt::print("grouped_mm: {} experts x {} rows, [{}] -> [{}] bf16 ({}: {})\n", o.experts, per,
             o.hidden, o.moe_ffn, "ATen's grouped path",
             dscpp::ops::grouped_mm_uses_aten(rows, w) ? "yes" : "no, the loop");
  at::Tensor grouped, loop;
  double g_ms = 0, l_ms = 0, d_ms = 0, gb_ms = 0;
  {
    const c10::NoGradGuard no_grad;
    g_ms = median_ms([&] { grouped = dscpp::ops::grouped_mm(rows, w, counts); }, o, stream);
    l_ms = median_ms([&] { loop = dscpp::ops::grouped_mm_loop(rows, w, counts); }, o, stream);
    d_ms = median_ms([&] { (void)at::mm(rows, dense_w); }, o, stream);
  }
  gb_ms = median_ms(
      [&] {
        at::Tensor y = dscpp::ops::grouped_mm(rows, w, counts);
        (void)torch::autograd::grad({y}, {rows, w}, {grad});
      },
      o, stream);
  const double diff = grouped.to(at::kFloat).sub(loop.to(at::kFloat)).abs().max().item<double>();
  fmt::print("  {:<34} {:>9} {:>9}\n", "", "ms", "TFLOP/s");
  fmt::print("  {:<34} {:>9.3f} {:>9.0f}\n", "grouped_mm", g_ms, tflops(g_ms));
  fmt::print("  {:<34} {:>9.3f} {:>9.0f}\n", "loop of products", l_ms, tflops(l_ms));
  fmt::print("  {:<34} {:>9.3f} {:>9.0f}\n", "one dense product, same FLOPs", d_ms, tflops(d_ms));
  fmt::print("  {:<34} {:>9.3f} {:>9.0f}\n", "grouped_mm forward+backward", gb_ms,
             3 * tflops(gb_ms));
  fmt::print("  grouped vs loop: {:.2f}x the speed, largest difference {:g}; vs dense {:.2f}x\n",
             l_ms / g_ms, diff, d_ms / g_ms);
}

int run(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) throw std::invalid_argument("missing value after " + a);
    const char* v = argv[++i];
    if (a == "--tokens")
      o.tokens = parse_int(v, "--tokens");
    else if (a == "--ffn")
      o.ffn = parse_int(v, "--ffn");
    else if (a == "--hidden")
      o.hidden = parse_int(v, "--hidden");
    else if (a == "--vocab")
      o.vocab = parse_int(v, "--vocab");
    else if (a == "--iters")
      o.iters = static_cast<int>(parse_int(v, "--iters"));
    else if (a == "--warmup")
      o.warmup = static_cast<int>(parse_int(v, "--warmup"));
    else if (a == "--device")
      o.device = static_cast<int>(parse_int(v, "--device"));
    else if (a == "--experts")
      o.experts = parse_int(v, "--experts");
    else if (a == "--moe-rows")
      o.moe_rows = parse_int(v, "--moe-rows");
    else if (a == "--moe-ffn")
      o.moe_ffn = parse_int(v, "--moe-ffn");
    else if (a == "--gelu" && (std::string(v) == "tanh" || std::string(v) == "none"))
      o.tanh = std::string(v) == "tanh";
    else
      throw std::invalid_argument(
          "unknown option or value: " + a + " " + v +
          " (expected --tokens, --ffn, --hidden, --vocab, --gelu tanh|none, "
          "--iters, --warmup, --device, --experts, --moe-rows, --moe-ffn)");
  }
  if (o.tokens < 1 || o.ffn < 1 || o.hidden < 1 || o.vocab < 1 || o.iters < 1 || o.experts < 1 ||
      o.moe_rows < o.experts || o.moe_ffn < 1)
    throw std::invalid_argument(
        "--tokens, --ffn, --hidden, --vocab, --iters, --experts, --moe-ffn must be >= 1 and "
        "--moe-rows >= --experts");
  if (c10::cuda::device_count() <= o.device)
    throw std::runtime_error(fmt::format("no CUDA device {}", o.device));

  const auto device = static_cast<c10::DeviceIndex>(o.device);
  const c10::cuda::CUDAGuard guard(device);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, o.device));
  const auto opts = at::TensorOptions().device(at::kCUDA, device);
  fmt::print("device {}: {}; median of {} calls after {} warm-up\n", o.device, prop.name, o.iters,
             o.warmup);
  fmt::print("device-to-device copy: {:.0f} GB/s (read + write)\n", copy_gbps(o, opts, stream));
  bench_bias_gelu(o, opts, stream);
  bench_cross_entropy(o, opts, stream);
  bench_add_layer_norm(o, opts, stream);
  bench_grouped_mm(o, opts, stream);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return dscpp::bench::main_of("kernels_bench", run, argc, argv);
}
