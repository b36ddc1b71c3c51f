// ZeRO-Offload's CPU Adam (ops/cpu_adam.h) in elements per second on partitions of the given
// sizes, with the bytes it moves per element and the bandwidth that reaches, beside a plain
// copy (ATen's, on the same threads) of the same bytes. Every CPU build has it;
// bench/cpu_adam_bench.py runs it next to DeepSpeed's DeepSpeedCPUAdam on the same cores.
// usage: cpu_adam_bench [--sizes N,N,...] [--steps K] [--grad fp32|bf16]   (JSON lines out)
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "dscpp/ops/cpu_adam.h"

namespace {

double seconds_of(const std::function<void()>& fn, int steps) {
  fn();  // warm: first touch of the pages, the pool's threads
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < steps; ++i) fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / steps;
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
    const double adam_s = seconds_of(
        [&] {
          args.step = ++step;
          dscpp::ops::cpu::adam_step(t, m, v, args);
        },
        steps);
    // Read p, m, v and the gradient; write p, m, v (and the 16-bit copy).
    const int64_t grad_bytes = bf16 ? 2 : 4, copy_bytes = bf16 ? 2 : 0;
    const int64_t bytes = 12 + grad_bytes + 12 + copy_bytes;
    // The same bytes through a plain copy: bytes / 2 read and bytes / 2 written per element.
    at::Tensor src = at::empty({n * bytes / 2}, at::kByte).fill_(1);
    at::Tensor dst = at::empty({n * bytes / 2}, at::kByte);
    const double copy_s = seconds_of([&] { dst.copy_(src); }, steps);
    fmt::print(
        "{{\"impl\": \"dscpp\", \"n\": {}, \"grad\": \"{}\", \"threads\": {}, \"isa\": \"{}\", "
        "\"elements_per_s\": {:.4g}, \"bytes_per_element\": {}, \"gb_per_s\": {:.2f}, "
        "\"copy_gb_per_s\": {:.2f}}}\n",
        n, grad, dscpp::ops::cpu::threads(), dscpp::ops::cpu::capability(), n / adam_s, bytes,
        n * bytes / adam_s / 1e9, n * bytes / copy_s / 1e9);
  }
  return 0;
}
