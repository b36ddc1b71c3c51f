// ZeRO-Offload's CPU Adam (ops/cpu_adam.h) in elements per second on partitions of the given
// sizes, with the bytes it moves per element and the bandwidth that reaches, beside a reference
// that moves the same bytes through the same arrays on the same threads, cut as the kernel cuts
// them (ops::cpu::for_ranges), with next to no arithmetic: p, m and v += g in place (and the
// 16-bit copy written), the fair ceiling. (ATen's copy_ of bytes / 2 into bytes / 2, the first
// reference, read 80-97 GB/s where Adam moved 130: other threads, other streams.) Every CPU build
// has it;
// bench/cpu_adam_bench.py runs it next to DeepSpeed's DeepSpeedCPUAdam on the same cores.
// usage: cpu_adam_bench [--sizes N,N,...] [--steps K] [--grad fp32|bf16]   (JSON lines out)
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/ops/cpu_adam.h"
#include "dscpp/ops/cpu_parallel.h"

namespace {

// Seconds a call takes: the mean over `steps` calls, and the fastest call (on a machine shared
// with other work the mean carries whatever else ran; the best is the code's own figure).
struct Timing {
  double mean = 0, best = 0;
};

Timing seconds_of(const std::function<void()>& fn, int steps) {
  fn();  // warm: first touch of the pages, the pool's threads
  Timing t;
  t.best = 1e30;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    t.mean += s / steps;
    t.best = std::min(t.best, s);
  }
  return t;
}

// The same streams as the step (read p, m, v, g; write p, m, v and the copy), split as the step
// splits them, with an add where Adam has its arithmetic; bf16's widening and narrowing by
// shifts (truncation), which vectorise.
void stream_reference(const at::Tensor& p, const at::Tensor& g, const at::Tensor& m,
                      const at::Tensor& v, const at::Tensor& copy) {
  float *pp = p.data_ptr<float>(), *mp = m.data_ptr<float>(), *vp = v.data_ptr<float>();
  const bool bf16 = g.scalar_type() == at::kBFloat16;
  const float* gf = bf16 ? nullptr : g.data_ptr<float>();
  const auto* gb = bf16 ? static_cast<const uint16_t*>(g.data_ptr()) : nullptr;
  auto* cb = copy.defined() ? static_cast<uint16_t*>(copy.data_ptr()) : nullptr;
  dscpp::ops::cpu::for_ranges(p.numel(), [&](int64_t begin, int64_t end) {
    if (!bf16) {
      for (int64_t i = begin; i < end; ++i) {
        const float x = gf[i];
        pp[i] += x;
        mp[i] += x;
        vp[i] += x;
      }
      return;
    }
    for (int64_t i = begin; i < end; ++i) {
      const uint32_t bits = static_cast<uint32_t>(gb[i]) << 16;
      float x;
      std::memcpy(&x, &bits, 4);
      const float q = pp[i] + x;
      pp[i] = q;
      mp[i] += x;
      vp[i] += x;
      uint32_t out;
      std::memcpy(&out, &q, 4);
      cb[i] = static_cast<uint16_t>(out >> 16);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {1 << 20, 1 << 24, 1 << 26};
  int steps = 10;
  std::string grad = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    if (flag == "--sizes") {
      sizes.clear();
      std::stringstream ss(value);
      for (std::string item; std::getline(ss, item, ',');) sizes.push_back(std::stoll(item));
    } else if (flag == "--steps") {
      steps = std::stoi(value);
    } else if (flag == "--grad") {
      grad = value;
    } else {
      std::cerr << "cpu_adam_bench: unknown flag " << flag << "\n";
      return 2;
    }
  }
  const bool bf16 = grad == "bf16";
  for (int64_t n : sizes) {
    at::Tensor p = at::randn({n}), m = at::zeros({n}), v = at::zeros({n});
    at::Tensor g = at::randn({n}).mul_(0.01);
    if (bf16) g = g.to(at::kBFloat16);
    at::Tensor copy = bf16 ? at::empty({n}, at::kBFloat16) : at::Tensor();
    dscpp::ops::cpu::StepTensors t;
    t.param = p;
    t.grad = g;
    t.param_copy = copy;
    dscpp::ops::cpu::AdamArgs args;
    args.weight_decay = 0.01;
    int64_t step = 0;
    const Timing adam = seconds_of(
        [&] {
          args.step = ++step;
          dscpp::ops::cpu::adam_step(t, m, v, args);
        },
        steps);
    // Read p, m, v and the gradient; write p, m, v (and the 16-bit copy).
    const int64_t grad_bytes = bf16 ? 2 : 4, copy_bytes = bf16 ? 2 : 0;
    const int64_t bytes = 12 + grad_bytes + 12 + copy_bytes;
    const Timing ref = seconds_of([&] { stream_reference(p, g, m, v, copy); }, steps);
    fmt::print(
        "{{\"impl\": \"dscpp\", \"n\": {}, \"grad\": \"{}\", \"threads\": {}, \"isa\": \"{}\", "
        "\"threading\": \"{}\", \"elements_per_s\": {:.4g}, \"best_elements_per_s\": {:.4g}, "
        "\"bytes_per_element\": {}, \"gb_per_s\": {:.2f}, \"ref_gb_per_s\": {:.2f}, "
        "\"ref_best_gb_per_s\": {:.2f}}}\n",
        n, grad, dscpp::ops::cpu::threads(), dscpp::ops::cpu::capability(),
        dscpp::ops::cpu::parallel_backend(), n / adam.mean, n / adam.best, bytes,
        n * bytes / adam.mean / 1e9, n * bytes / ref.mean / 1e9, n * bytes / ref.best / 1e9);
  }
  return 0;
}
