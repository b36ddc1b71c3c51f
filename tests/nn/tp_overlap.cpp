// ColumnParallelLinear's overlapped backward (async_tensor_model_parallel_allreduce, Megatron's
// LinearWithGradAccumulationAndAsyncCommunication) against its synchronous path, on each model
// group: the same outputs and gradients bit for bit, with and without sequence parallelism;
// the collectives it issues (sequence parallelism: the input all-gathered again in backward);
// and the order of its steps: each wait after the product it overlaps.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dscpp/nn/linear_async_communication.h"
#include "dscpp/nn/parallel_linear.h"
#include "tp_test_util.h"

using dscpp::nn::ColumnParallelLinear;
using dscpp::nn::ParallelLinearOptions;
using dscpp::nn::RowParallelLinear;
using tp_test::chunk;
using tp_test::draw;
using tp_test::model_groups;

namespace {

constexpr int64_t kSeq = 8, kBatch = 2, kHidden = 16, kFfn = 32;

void assign(const at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.copy_(value);
}

// Calls issued on a group, per op: a count since its construction or a difference of two.
struct Issued {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
  Issued operator-(const Issued& o) const {
    return {all_reduce - o.all_reduce, all_gather - o.all_gather,
            reduce_scatter - o.reduce_scatter};
  }
};

Issued issued_now(const dscpp::comm::ProcessGroup& g) {
  return {g.issued("all_reduce").calls, g.issued("all_gather").calls,
          g.issued("reduce_scatter").calls};
}

struct MlpRun {
  at::Tensor y, x_grad;
  std::vector<at::Tensor> grads;  // fc weight, fc bias, proj weight, proj bias
};

// A Megatron MLP (column, GeLU, row), the column layer's overlap switched by `async`.
MlpRun mlp(const tp_test::ModelGroup& g, bool async, bool sp) {
  at::manual_seed(51);
  ColumnParallelLinear fc(ParallelLinearOptions(kHidden, kFfn)
                              .sequence_parallel(sp)
                              .async_tensor_model_parallel_allreduce(async),
                          g.group);
  RowParallelLinear proj(
      ParallelLinearOptions(kFfn, kHidden).input_is_parallel(true).sequence_parallel(sp), g.group);
  assign(fc->bias, chunk(draw({kFfn}, 52, at::kFloat), 0, g));
  assign(proj->bias, draw({kHidden}, 53, at::kFloat));
  const at::Tensor x_whole = draw({kSeq, kBatch, kHidden}, 54, at::kFloat);
  const at::Tensor r_whole = draw({kSeq, kBatch, kHidden}, 55, at::kFloat);
  const at::Tensor x = (sp ? chunk(x_whole, 0, g) : x_whole).requires_grad_();
  at::Tensor y = proj(at::gelu(fc(x).first)).first;
  (y * (sp ? chunk(r_whole, 0, g) : r_whole)).sum().backward();
  return {y.detach(),
          x.grad(),
          {fc->weight.grad(), fc->bias.grad(), proj->weight.grad(), proj->bias.grad()}};
}

TEST(TensorParallelOverlap, AsyncBackwardEqualsSynchronousBitForBit) {
  for (const auto& g : model_groups())
    for (bool sp : {false, true}) {
      SCOPED_TRACE(g.name + (sp ? " sequence_parallel" : ""));
      const MlpRun async = mlp(g, true, sp), sync = mlp(g, false, sp);
      EXPECT_TRUE(at::equal(async.y, sync.y));
      EXPECT_TRUE(at::equal(async.x_grad, sync.x_grad));
      for (size_t i = 0; i < sync.grads.size(); ++i) {
        SCOPED_TRACE("gradient " + std::to_string(i));
        ASSERT_TRUE(async.grads[i].defined());
        EXPECT_TRUE(at::equal(async.grads[i], sync.grads[i]));
      }
    }
}

// The column layer alone: which collectives forward and backward issue, and in what order
// backward runs its steps.
struct ColumnRun {
  Issued forward_delta, backward_delta;
  std::vector<std::string> trace;
};

ColumnRun column(const tp_test::ModelGroup& g, bool async, bool sp, bool input_grad) {
  at::manual_seed(61);
  ColumnParallelLinear fc(ParallelLinearOptions(kHidden, kFfn)
                              .sequence_parallel(sp)
                              .async_tensor_model_parallel_allreduce(async),
                          g.group);
  const at::Tensor x_whole = draw({kSeq, kBatch, kHidden}, 62, at::kFloat);
  const at::Tensor x = (sp ? chunk(x_whole, 0, g) : x_whole).requires_grad_(input_grad);
  ColumnRun run;
  const Issued before = issued_now(*g.group);
  at::Tensor y = fc(x).first;
  const Issued mid = issued_now(*g.group);
  dscpp::nn::set_async_communication_trace(&run.trace);
  y.sum().backward();
  dscpp::nn::set_async_communication_trace(nullptr);
  const Issued after = issued_now(*g.group);
  run.forward_delta = mid - before;
  run.backward_delta = after - mid;
  return run;
}

Issued counts(int64_t all_reduce, int64_t all_gather, int64_t reduce_scatter) {
  return {all_reduce, all_gather, reduce_scatter};
}

void expect_counts(const Issued& got, const Issued& want, const char* what) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.all_reduce, want.all_reduce);
  EXPECT_EQ(got.all_gather, want.all_gather);
  EXPECT_EQ(got.reduce_scatter, want.reduce_scatter);
}

TEST(TensorParallelOverlap, IssuedCollectivesAndStepOrder) {
  using Trace = std::vector<std::string>;
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    {  // no sequence parallelism: grad_input's all-reduce in flight during grad_weight
      const ColumnRun a = column(g, true, false, true), s = column(g, false, false, true);
      expect_counts(a.forward_delta, counts(0, 0, 0), "async forward");
      expect_counts(a.backward_delta, counts(1, 0, 0), "async backward");
      expect_counts(s.forward_delta, counts(0, 0, 0), "sync forward");
      expect_counts(s.backward_delta, counts(1, 0, 0), "sync backward");
      EXPECT_EQ(a.trace, (Trace{"grad_input", "issue all_reduce", "grad_weight", "grad_bias",
                                "wait all_reduce"}));
      EXPECT_TRUE(s.trace.empty());
    }
    {  // sequence parallelism: the input gathered again during grad_input, grad_input's
       // reduce-scatter in flight during grad_weight
      const ColumnRun a = column(g, true, true, true), s = column(g, false, true, true);
      expect_counts(a.forward_delta, counts(0, 1, 0), "async sp forward");
      expect_counts(a.backward_delta, counts(0, 1, 1), "async sp backward");
      expect_counts(s.forward_delta, counts(0, 1, 0), "sync sp forward");
      expect_counts(s.backward_delta, counts(0, 0, 1), "sync sp backward");
      EXPECT_EQ(a.trace,
                (Trace{"issue all_gather", "grad_input", "wait all_gather", "issue reduce_scatter",
                       "grad_weight", "grad_bias", "wait reduce_scatter"}));
    }
    {  // an input without a gradient: nothing to reduce; the shard still gathered for grad_weight
      const ColumnRun a = column(g, true, false, false), b = column(g, true, true, false);
      expect_counts(a.backward_delta, counts(0, 0, 0), "async, no input grad");
      EXPECT_EQ(a.trace, (Trace{"grad_weight", "grad_bias"}));
      expect_counts(b.backward_delta, counts(0, 1, 0), "async sp, no input grad");
      EXPECT_EQ(b.trace,
                (Trace{"issue all_gather", "wait all_gather", "grad_weight", "grad_bias"}));
    }
  }
}

// Options the switch leaves alone: gather_output and skip_bias_add, async ≡ sync.
TEST(TensorParallelOverlap, GatherOutputAndSkipBiasAddUnchanged) {
  for (const auto& g : model_groups())
    for (bool gather : {false, true}) {
      SCOPED_TRACE(g.name + (gather ? " gather_output" : " skip_bias_add"));
      std::vector<at::Tensor> got[2];
      for (bool async : {false, true}) {
        at::manual_seed(71);
        ColumnParallelLinear fc(ParallelLinearOptions(kHidden, kFfn)
                                    .gather_output(gather)
                                    .skip_bias_add(!gather)
                                    .async_tensor_model_parallel_allreduce(async),
                                g.group);
        assign(fc->bias, chunk(draw({kFfn}, 72, at::kFloat), 0, g));
        const at::Tensor x = draw({kBatch, kSeq, kHidden}, 73, at::kFloat).requires_grad_();
        auto [y, bias] = fc(x);
        at::Tensor z = gather ? y : y + bias;
        (z * draw(z.sizes(), 74 + g.r(), at::kFloat)).sum().backward();
        got[async] = {z.detach(), x.grad(), fc->weight.grad(), fc->bias.grad()};
      }
      for (size_t i = 0; i < got[0].size(); ++i) EXPECT_TRUE(at::equal(got[0][i], got[1][i])) << i;
    }
}

}  // namespace
