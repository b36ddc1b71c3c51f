// ZeRO's own accounting of its buffers (ZeroOptimizer::memory_breakdown, what the engine and
// train_gpt report) against the ZeRO paper's model-state formulas, by hand, for N parameters
// in bf16 over W ranks (a no-op group of W: the layout and partitions of W ranks in one
// process), Adam (two fp32 states): 2N of 16-bit parameters (2N / W at stage 3), 2N of 16-bit
// gradients at stages 0-1 when they accumulate (none without accumulation), a gradient
// partition of 2N / W (bf16) or 4N / W (fp32), 4N / W of fp32 master and 8N / W of Adam state
// (W = 1 at stage 0). On one rank (a group of 1) at stages 0-1 with accumulation the gradient
// partition is the flat buffer itself (ZeroOptions::alias_grad_partition): 2N once, listed as
// grad_partition, no grads16.flat. With offload_optimizer everything
// but the parameters (and stage 1's flat gradients) is on the host, as DeepSpeed's
// ZeRO-Offload keeps it; with offload_param too, nothing stays on the device at rest. Before
// the first backward of stages 0-2 only the 16-bit parameters exist. After a step, the reduce
// buckets in flight held at most a few buckets at once, never a whole
// gradient buffer.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/zero/zero_optimizer.h"

namespace {

using dscpp::zero::bytes_named;
using dscpp::zero::MemoryBreakdown;
using dscpp::zero::total_bytes;
using dscpp::zero::ZeroOptimizer;
using dscpp::zero::ZeroOptions;

constexpr int64_t kParams = 15, kEach = 64, N = kParams * kEach;  // multiples of W * 8: no padding

struct Case {
  int stage;
  int world;
  bool offload, offload_param;
  at::ScalarType grad_dtype;
  bool accumulates = true;  // gradient_accumulation_steps > 1: stages 0-1 keep a flat buffer
  bool alias = true;        // ZeroOptions::alias_grad_partition
};

std::string name(const Case& c) {
  return "stage " + std::to_string(c.stage) + " world " + std::to_string(c.world) +
         (c.offload ? " offload" : "") + (c.offload_param ? " offload_param" : "") + " grads " +
         c10::toString(c.grad_dtype) + (c.accumulates ? "" : " no accumulation") +
         (c.alias ? "" : " no alias");
}

struct Trainer {
  std::vector<at::Tensor> params;
  std::unique_ptr<ZeroOptimizer> zero;
};

Trainer make(const Case& c) {
  at::manual_seed(3);
  Trainer r;
  for (int i = 0; i < kParams; ++i)
    r.params.push_back(at::randn({kEach}).to(at::kBFloat16).requires_grad_());
  ZeroOptions o;
  o.stage = c.stage;
  o.reduce_bucket_size = kEach;  // one parameter a bucket: 15 buckets
  o.grad_dtype = c.grad_dtype;
  o.accumulates = c.accumulates;
  o.alias_grad_partition = c.alias;
  o.offload.enabled = c.offload;
  o.offload_param.enabled = c.offload_param;
  dscpp::OptimizerConfig oc;
  oc.type = "Adam";
  oc.params = {{"lr", 0.01}};
  auto opt = dscpp::optim::make_optimizer(oc);
  opt->set_cpu_kernels(c.offload);
  r.zero = std::make_unique<ZeroOptimizer>(r.params, std::move(opt),
                                           dscpp::comm::make_no_op_group(0, c.world), o);
  return r;
}

void step(Trainer& r) {
  r.zero->gather();
  r.zero->begin_backward(true);
  at::Tensor loss = at::zeros({}, at::kFloat);
  for (size_t i = 0; i < r.params.size(); ++i)
    loss = loss + (r.params[i].to(at::kFloat) * (1.0 + i)).sin().sum();
  loss.backward();
  r.zero->end_backward();
  r.zero->release();
  r.zero->step(1.0);
}

// Whether the gradient partition is the flat buffer: one rank of a group of one, the flat
// buffer's type, on the device (the bf16 parameters' gradients into a bf16 partition).
bool aliased(const Case& c) {
  return c.alias && c.stage < 2 && c.accumulates && c.world == 1 && !c.offload &&
         c.grad_dtype == at::kBFloat16;
}

// The hand formula: name -> (bytes, on the device). Before the first backward of stages 0-2
// (built false) only the 16-bit parameters exist.
std::map<std::string, std::pair<int64_t, bool>> expected(const Case& c, bool built) {
  const int64_t W = c.stage == 0 ? 1 : c.world, g = c.grad_dtype == at::kFloat ? 4 : 2;
  const bool host = c.offload;
  std::map<std::string, std::pair<int64_t, bool>> e;
  if (c.stage < 3) e["params16.flat"] = {2 * N, true};
  if (!built) return e;
  if (c.stage == 3) e["params16.partition"] = {2 * N / W, !c.offload_param};
  if (c.stage < 2 && c.accumulates && !aliased(c)) e["grads16.flat"] = {2 * N, true};
  e["grad_partition"] = {g * N / W, !host};
  e["fp32_master"] = {4 * N / W, !host};
  e["optimizer.exp_avg"] = {4 * N / W, !host};
  e["optimizer.exp_avg_sq"] = {4 * N / W, !host};
  return e;
}

void check(const MemoryBreakdown& m, const Case& c, const char* when, bool built = true) {
  const auto e = expected(c, built);
  int64_t device = 0, host = 0;
  for (const auto& [n, v] : e) {
    EXPECT_EQ(bytes_named(m, n), v.first) << name(c) << " " << when << ": " << n;
    (v.second ? device : host) += v.first;
  }
  for (const auto& i : m) {
    // (the staging buffers: offload.staging on the host, params16.staging on the device,
    // made as the steps need them, checked below)
    if (i.bytes == 0 || i.name == "offload.staging" || i.name == "params16.staging") continue;
    auto it = e.find(i.name);
    ASSERT_NE(it, e.end()) << name(c) << " " << when << ": unexpected buffer " << i.name;
    EXPECT_EQ(i.on_device, it->second.second) << name(c) << " " << when << ": " << i.name;
  }
  EXPECT_EQ(total_bytes(m, true) - bytes_named(m, "params16.staging"), device)
      << name(c) << " " << when;
  // The host: the formula, plus the offloaded step's two staging slots.
  EXPECT_EQ(total_bytes(m, false) - bytes_named(m, "offload.staging"), host)
      << name(c) << " " << when;
}

TEST(MemoryBreakdown, ModelStatesMatchTheFormulaAtEveryStageWithAndWithoutOffload) {
  std::vector<Case> cases;
  for (int stage : {1, 2, 3})
    for (int world : {1, 4})
      for (bool offload : {false, true})
        cases.push_back({stage, world, offload, false, at::kBFloat16});
  cases.push_back({2, 4, true, false, at::kFloat});  // an fp32 partition (accumulation)
  cases.push_back({2, 1, false, false, at::kFloat});
  cases.push_back({1, 1, false, false, at::kFloat});   // fp32 partition of bf16 gradients: two
  cases.push_back({3, 4, true, true, at::kBFloat16});  // both offloads: nothing on the device
  // Stage 0 holds everything whole; without accumulation stages 0-1 keep no flat gradients.
  for (int world : {1, 4}) {
    cases.push_back({0, world, false, false, at::kBFloat16});
    cases.push_back({0, world, false, false, at::kBFloat16, false});
    cases.push_back({1, world, false, false, at::kBFloat16, false});
  }
  cases.push_back({1, 4, true, false, at::kBFloat16, false});
  for (const Case& c : cases) {
    Trainer r = make(c);
    check(r.zero->memory_breakdown(), c, "at start", /*built=*/c.stage >= 3);
    step(r);
    check(r.zero->memory_breakdown(), c, "after one step");
    EXPECT_EQ(r.zero->grads_aliased(), aliased(c)) << name(c);
    if (c.stage < 2 && c.accumulates) {  // (the flat buffer and the partition: one storage or two)
      EXPECT_EQ(r.zero->grad_partition().is_alias_of(r.zero->grad_buckets().flat_grads()),
                aliased(c))
          << name(c);
    }
    step(r);
    const MemoryBreakdown after = r.zero->memory_breakdown();
    check(after, c, "after two steps");
    EXPECT_EQ(bytes_named(after, "reduce_buckets"), 0) << name(c) << ": buckets at rest";
    // Stages 2-3 keep no whole 16-bit gradient buffer: a bucket is 128 bytes here (its
    // storage, its reduced chunk, the copy down of a host partition), at most two in flight
    // and one being filled.
    if (c.stage >= 2 || !c.accumulates) {
      const int64_t bucket = kEach * 2;
      // (one rank with a 16-bit partition on the device: the buckets are the partition's
      // slices, written by the products themselves: nothing in flight beyond it)
      const bool in_partition = c.world == 1 && !c.offload && c.grad_dtype == at::kBFloat16;
      if (in_partition) {
        EXPECT_EQ(r.zero->reduce_buckets_peak(), 0) << name(c);
      } else
        EXPECT_GT(r.zero->reduce_buckets_peak(), 0) << name(c);
      EXPECT_LE(r.zero->reduce_buckets_peak(), 6 * bucket) << name(c);
      EXPECT_LT(6 * bucket, 2 * N);  // (the bound means something)
    }
    if (c.offload) {
      EXPECT_GT(bytes_named(after, "offload.staging"), 0) << name(c);
    }
    if (aliased(c)) {
      // The same steps with two buffers (the alias off) give the same bits, and list both.
      Case two = c;
      two.alias = false;
      Trainer reference = make(two);
      step(reference);
      step(reference);
      EXPECT_FALSE(reference.zero->grads_aliased());
      check(reference.zero->memory_breakdown(), two, "after two steps");
      EXPECT_EQ(bytes_named(reference.zero->memory_breakdown(), "grads16.flat"), 2 * N);
      for (size_t i = 0; i < r.params.size(); ++i)
        EXPECT_TRUE(r.params[i].equal(reference.params[i])) << name(c) << ": parameter " << i;
    }
    if (c.stage < 2 && !c.accumulates) {
      // The same steps through the flat buffer (what accumulation uses) give the same bits.
      Case flat = c;
      flat.accumulates = true;
      Trainer reference = make(flat);
      step(reference);
      step(reference);
      for (size_t i = 0; i < r.params.size(); ++i)
        EXPECT_TRUE(r.params[i].equal(reference.params[i])) << name(c) << ": parameter " << i;
    }
    if (c.offload && c.stage == 2) {
      EXPECT_EQ(total_bytes(after, true), 2 * N) << name(c) << ": DeepSpeed's 16-bit params only";
    }
  }
}

}  // namespace
