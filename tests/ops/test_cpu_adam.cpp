// The CPU optimizers (ops/cpu_adam.h): each against its update worked out per element in
// double from DeepSpeed's formulas; a 16-bit gradient, a fused grad scale, a param copy and the
// split over threads change nothing but what they should; bad tensors are refused by name.
// (PyTorch's torch.optim and DeepSpeed's own CPU kernels: test_cpu_optim_against_torch.py.)
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dscpp/error.h"
#include "dscpp/ops/cpu_adam.h"
#include "dscpp/ops/cpu_parallel.h"

namespace {

namespace cpu = dscpp::ops::cpu;

// An odd size: whole vectors, a partial vector at the end, more than one tile.
constexpr int64_t kN = 2053;

struct Case {
  at::Tensor p, g, m, v;
};

Case make_case(int64_t n = kN, uint64_t seed = 7) {
  at::manual_seed(seed);
  Case c;
  c.p = at::randn({n});
  c.g = at::randn({n}).mul_(0.1);
  c.m = at::randn({n}).mul_(0.01);
  c.v = at::rand({n}).mul_(0.001);
  return c;
}

cpu::StepTensors tensors(const Case& c, float scale = 1.0f, at::Tensor copy = {}) {
  cpu::StepTensors t;
  t.param = c.p;
  t.grad = c.g;
  t.grad_scale = scale;
  t.param_copy = std::move(copy);
  return t;
}

// ||got - want|| / ||want||: fp32 arithmetic against double leaves a few ulps per element.
double max_rel(const at::Tensor& got, const std::vector<double>& want) {
  const float* d = got.data_ptr<float>();
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (d[i] - want[i]) * (d[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

std::vector<double> as_double(const at::Tensor& t) {
  const float* d = t.data_ptr<float>();
  return {d, d + t.numel()};
}

void adam_by_hand(const cpu::AdamArgs& a, std::vector<double>& p, const std::vector<double>& g,
                  std::vector<double>& m, std::vector<double>& v, double scale) {
  const double bc1 = 1 - std::pow(a.beta1, a.step), bc2 = 1 - std::pow(a.beta2, a.step);
  for (size_t i = 0; i < p.size(); ++i) {
    double gi = g[i] * scale;
    if (!a.adam_w_mode) gi += a.weight_decay * p[i];
    m[i] = a.beta1 * m[i] + (1 - a.beta1) * gi;
    v[i] = a.beta2 * v[i] + (1 - a.beta2) * gi * gi;
    if (a.adam_w_mode) p[i] *= 1 - a.lr * a.weight_decay;
    p[i] -= a.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + a.eps);
  }
}

TEST(CpuAdam, AdamWAndAdamMatchTheirUpdateWorkedOutInDouble) {
  for (bool adamw : {true, false}) {
    Case c = make_case();
    auto p = as_double(c.p), g = as_double(c.g), m = as_double(c.m), v = as_double(c.v);
    cpu::AdamArgs a;
    a.lr = 1e-2;
    a.weight_decay = 0.1;
    a.adam_w_mode = adamw;
    for (int64_t step = 1; step <= 3; ++step) {
      a.step = step;
      cpu::adam_step(tensors(c, 0.5f), c.m, c.v, a);
      adam_by_hand(a, p, g, m, v, 0.5);
    }
    EXPECT_LT(max_rel(c.p, p), 1e-6) << (adamw ? "adamw" : "adam");
    EXPECT_LT(max_rel(c.m, m), 1e-6);
    EXPECT_LT(max_rel(c.v, v), 1e-6);
  }
}

TEST(CpuAdam, AdagradMatchesTorchFormulaWithLrDecay) {
  Case c = make_case();
  auto p = as_double(c.p), g = as_double(c.g), sum = as_double(c.v);
  cpu::AdagradArgs a;
  a.lr = 0.05;
  a.weight_decay = 0.01;
  a.lr_decay = 0.1;
  for (int64_t step = 1; step <= 3; ++step) {
    a.step = step;
    cpu::adagrad_step(tensors(c), c.v, a);
    const double clr = a.lr / (1 + (step - 1) * a.lr_decay);
    for (size_t i = 0; i < p.size(); ++i) {
      const double gi = g[i] + a.weight_decay * p[i];
      sum[i] += gi * gi;
      p[i] -= clr * gi / (std::sqrt(sum[i]) + a.eps);
    }
  }
  EXPECT_LT(max_rel(c.p, p), 1e-6);
  EXPECT_LT(max_rel(c.v, sum), 1e-6);
}

TEST(CpuAdam, LionStepsBySignAndLeavesZeroAlone) {
  Case c = make_case();
  // Elements whose interpolation c is exactly 0 are not moved (sign(0) = 0).
  c.g.narrow(0, 0, 4).zero_();
  c.m.narrow(0, 0, 4).zero_();
  auto p = as_double(c.p), g = as_double(c.g), m = as_double(c.m);
  cpu::LionArgs a;
  a.lr = 1e-3;
  a.weight_decay = 0.5;
  cpu::lion_step(tensors(c), c.m, a);
  for (size_t i = 0; i < p.size(); ++i) {
    const double ci = a.beta1 * m[i] + (1 - a.beta1) * g[i];
    const double sign = ci > 0 ? 1 : (ci < 0 ? -1 : 0);
    p[i] = p[i] * (1 - a.lr * a.weight_decay) - a.lr * sign;
    m[i] = a.beta2 * m[i] + (1 - a.beta2) * g[i];
  }
  EXPECT_LT(max_rel(c.p, p), 1e-6);
  EXPECT_LT(max_rel(c.m, m), 1e-6);
  EXPECT_FLOAT_EQ(c.p[0].item<float>(), static_cast<float>(p[0]));
}

TEST(CpuAdam, SixteenBitGradientStepsAsItsWidenedValues) {
  for (auto type : {at::kBFloat16, at::kHalf}) {
    Case a = make_case(), b = make_case();
    b.g = a.g.to(type);
    a.g = b.g.to(at::kFloat);
    cpu::AdamArgs args;
    cpu::adam_step(tensors(a), a.m, a.v, args);
    cpu::adam_step(tensors(b), b.m, b.v, args);
    EXPECT_TRUE(at::equal(a.p, b.p));
    EXPECT_TRUE(at::equal(a.v, b.v));
  }
}

TEST(CpuAdam, ParamCopyIsTheUpdatedParametersCast) {
  for (auto type : {at::kBFloat16, at::kHalf, at::kFloat}) {
    Case c = make_case();
    at::Tensor copy = at::zeros({kN}, type);
    cpu::lion_step(tensors(c, 1.0f, copy), c.m, cpu::LionArgs());
    EXPECT_TRUE(at::equal(copy, c.p.to(type)));
  }
}

TEST(CpuAdam, ThreadsSplitTheRangeWithoutChangingABit) {
  const int before = at::get_num_threads();
  Case one = make_case(300000), two = make_case(300000);
  at::set_num_threads(1);
  cpu::adam_step(tensors(one), one.m, one.v, cpu::AdamArgs());
  at::set_num_threads(2);
  EXPECT_EQ(cpu::threads(), 2);
  cpu::adam_step(tensors(two), two.m, two.v, cpu::AdamArgs());
  at::set_num_threads(before);
  EXPECT_TRUE(at::equal(one.p, two.p));
  EXPECT_TRUE(at::equal(one.m, two.m));
  EXPECT_TRUE(at::equal(one.v, two.v));
}

TEST(CpuParallel, RangesCoverEveryElementOnceInWholeBlocksOnSeveralThreads) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  constexpr int64_t n = 10 * 1024 + 5;
  std::vector<int> hits(n, 0);
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  std::set<std::thread::id> threads;
  cpu::parallel_ranges(n, 1024, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ++hits[i];
    std::lock_guard<std::mutex> lock(mutex);
    ranges.emplace_back(begin, end);
    threads.insert(std::this_thread::get_id());
  });
  at::set_num_threads(before);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << i;
  ASSERT_EQ(ranges.size(), 2u);
  for (const auto& [begin, end] : ranges)
    if (end != n) {
      EXPECT_EQ(end % 1024, 0) << begin << "-" << end;
    }
  // Two threads where LibTorch's OpenMP team is there (one process-wide pool of them).
  if (std::string(cpu::parallel_backend()) == "openmp") {
    EXPECT_EQ(threads.size(), 2u);
  }
  // Below two grains the caller's thread alone.
  int calls = 0;
  cpu::parallel_ranges(100, 1, 64, [&](int64_t begin, int64_t end) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 100);
  });
  EXPECT_EQ(calls, 1);
}

TEST(CpuParallel, ALimitedThreadsTeamIsItsOwnAndNoOneElses) {
  if (std::string(cpu::parallel_backend()) != "openmp") {
    GTEST_SKIP() << "no libgomp team here";
  }
  const int before = at::get_num_threads();
  at::set_num_threads(3);
  int inside = 0;
  std::set<std::thread::id> used;
  std::thread worker([&] {
    cpu::limit_thread_team(1);
    inside = at::get_num_threads();
    std::mutex mutex;
    cpu::parallel_ranges(1 << 16, 1024, 1024, [&](int64_t, int64_t) {
      std::lock_guard<std::mutex> lock(mutex);
      used.insert(std::this_thread::get_id());
    });
  });
  worker.join();
  const int outside = at::get_num_threads();
  std::set<std::thread::id> main_used;
  std::mutex mutex;
  cpu::parallel_ranges(1 << 16, 1024, 1024, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lock(mutex);
    main_used.insert(std::this_thread::get_id());
  });
  at::set_num_threads(before);
  EXPECT_EQ(inside, 1);
  EXPECT_EQ(used.size(), 1u);  // the worker's work on the worker alone
  EXPECT_EQ(outside, 3);       // the process-wide count untouched
  EXPECT_EQ(main_used.size(), 3u);
}

TEST(CpuParallel, ARangesExceptionReachesTheCaller) {
  const int before = at::get_num_threads();
  at::set_num_threads(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(cpu::parallel_ranges(1 << 12, 1, 1,
                                    [&](int64_t begin, int64_t) {
                                      ++ran;
                                      if (begin > 0) throw std::runtime_error("range failed");
                                    }),
               std::runtime_error);
  at::set_num_threads(before);
  EXPECT_GE(ran.load(), 1);
}

TEST(CpuAdam, ReportsTheInstructionSetItRunsWith) {
  const std::string cap = cpu::capability();
  EXPECT_TRUE(cap == "AVX512" || cap == "AVX2" || cap == "DEFAULT") << cap;
}

TEST(CpuAdam, RefusesTensorsOfTheWrongKindByName) {
  Case c = make_case();
  auto message = [&](cpu::StepTensors t, at::Tensor m) {
    try {
      cpu::adam_step(t, m, c.v, cpu::AdamArgs());
    } catch (const dscpp::Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  cpu::StepTensors t = tensors(c);
  t.grad = c.g.narrow(0, 0, 10);
  EXPECT_NE(message(t, c.m).find("grad must be a contiguous CPU tensor of 2053"),
            std::string::npos);
  t = tensors(c);
  t.grad = c.g.to(at::kDouble);
  EXPECT_NE(message(t, c.m).find("grad is Double"), std::string::npos);
  EXPECT_NE(message(tensors(c), c.m.to(at::kHalf)).find("optimizer state is Half"),
            std::string::npos);
}

}  // namespace
