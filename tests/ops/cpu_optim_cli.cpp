// Runs one of the CPU optimizers (ops/cpu_adam.h) over gradients the Python test wrote, and
// writes the parameters after every step, for test_cpu_optim_against_torch.py.
// usage: cpu_optim_cli ALGO DIR N STEPS LR WEIGHT_DECAY   (ALGO: adam adamw adagrad lion)
// DIR holds p0.bin and g1.bin ... gSTEPS.bin (raw float32); p1.bin ... are written there.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "dscpp/ops/cpu_adam.h"

namespace {

at::Tensor read(const std::string& path, int64_t n) {
  at::Tensor t = at::empty({n}, at::kFloat);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()), n * 4);
  if (!in) throw std::runtime_error("cannot read " + path);
  return t;
}

void write(const std::string& path, const at::Tensor& t) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * 4);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) {
    std::cerr << "usage: cpu_optim_cli ALGO DIR N STEPS LR WEIGHT_DECAY\n";
    return 2;
  }
  const std::string algo = argv[1], dir = argv[2];
  const int64_t n = std::stoll(argv[3]), steps = std::stoll(argv[4]);
  const double lr = std::stod(argv[5]), wd = std::stod(argv[6]);
  try {
    at::Tensor p = read(dir + "/p0.bin", n);
    at::Tensor s0 = at::zeros({n}), s1 = at::zeros({n});
    for (int64_t k = 1; k <= steps; ++k) {
      dscpp::ops::cpu::StepTensors t;
      t.param = p;
      t.grad = read(dir + "/g" + std::to_string(k) + ".bin", n);
      if (algo == "adam" || algo == "adamw") {
        dscpp::ops::cpu::AdamArgs a;
        a.lr = lr;
        a.weight_decay = wd;
        a.step = k;
        a.adam_w_mode = algo == "adamw";
        dscpp::ops::cpu::adam_step(t, s0, s1, a);
      } else if (algo == "adagrad") {
        dscpp::ops::cpu::AdagradArgs a;
        a.lr = lr;
        a.weight_decay = wd;
        a.step = k;
        dscpp::ops::cpu::adagrad_step(t, s0, a);
      } else if (algo == "lion") {
        dscpp::ops::cpu::LionArgs a;
        a.lr = lr;
        a.weight_decay = wd;
        dscpp::ops::cpu::lion_step(t, s0, a);
      } else {
        std::cerr << "unknown algorithm " << algo << "\n";
        return 2;
      }
      write(dir + "/p" + std::to_string(k) + ".bin", p);
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  std::cout << dscpp::ops::cpu::capability() << "\n";
  return 0;
}
