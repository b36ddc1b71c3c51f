// ColumnParallelLinear's overlapped backward (async_tensor_model_parallel_allreduce, Megatron's
// LinearWithGradAccumulationAndAsyncCommunication) against its synchronous path, on each model
// group: the same outputs and gradients bit for bit, with and without sequence parallelism;
// the collectives it issues (sequence parallelism: the input all-gathered again in backward);
// and the order of its steps: each wait after the product it overlaps.
// tp_comm_overlap (nn/tp_comm_overlap.h): the forward collectives of both layers pipelined with
// their products in pieces (even, uneven, more pieces than rows) against the one-collective
// path: the same outputs and gradients (1e-6 relative), the pieces' collectives and their order.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/nn/linear_async_communication.h"
#include "dscpp/nn/parallel_linear.h"
#include "dscpp/nn/tp_comm_overlap.h"
#include "tp_test_util.h"

using dscpp::nn::ColumnParallelLinear;
using dscpp::nn::ParallelLinearOptions;
using dscpp::nn::RowParallelLinear;
using tp_test::chunk;
using tp_test::draw;
using tp_test::model_groups;
using tp_test::rel_close;

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

// The MLP with tp_comm_overlap in `splits` pieces (0: off), `seq` rows of the whole sequence;
// the collectives each forward issued beside it.
struct OverlapRun {
  MlpRun mlp;
  Issued forward_delta;
};

OverlapRun mlp_overlap(const tp_test::ModelGroup& g, bool sp, int64_t splits, int64_t seq) {
  at::manual_seed(81);
  auto options = [&](int64_t in, int64_t out) {
    return ParallelLinearOptions(in, out)
        .sequence_parallel(sp)
        .tp_comm_overlap(splits > 0)
        .tp_comm_overlap_num_splits(splits > 0 ? splits : 2);
  };
  ColumnParallelLinear fc(options(kHidden, kFfn), g.group);
  RowParallelLinear proj(options(kFfn, kHidden).input_is_parallel(true), g.group);
  assign(fc->bias, chunk(draw({kFfn}, 82, at::kFloat), 0, g));
  assign(proj->bias, draw({kHidden}, 83, at::kFloat));
  const at::Tensor x_whole = draw({seq, kBatch, kHidden}, 84, at::kFloat);
  const at::Tensor r_whole = draw({seq, kBatch, kHidden}, 85, at::kFloat);
  const at::Tensor x = (sp ? chunk(x_whole, 0, g) : x_whole).requires_grad_();
  OverlapRun run;
  const Issued before = issued_now(*g.group);
  at::Tensor y = proj(at::gelu(fc(x).first)).first;
  run.forward_delta = issued_now(*g.group) - before;
  (y * (sp ? chunk(r_whole, 0, g) : r_whole)).sum().backward();
  run.mlp = {y.detach(),
             x.grad(),
             {fc->weight.grad(), fc->bias.grad(), proj->weight.grad(), proj->bias.grad()}};
  return run;
}

TEST(TensorParallelOverlap, TpCommOverlapEqualsOneCollective) {
  int bitwise = 0, compared = 0;
  for (const auto& g : model_groups())
    for (bool sp : {true, false})
      for (int64_t splits : {1, 2, 3, 5}) {
        // The rows each collective cuts: this rank's sequence shard, or (row all-reduce) the
        // whole sequence. 2 ranks: 4 or 8 rows, so 3 is uneven and 5 more than a shard's rows.
        const int64_t seq = sp ? kSeq : kSeq - 1;
        const int64_t rows = sp ? seq / g.t() : seq;
        const int64_t pieces = std::min(splits, rows);
        SCOPED_TRACE(g.name + (sp ? " sequence_parallel" : "") + " splits " +
                     std::to_string(splits));
        const OverlapRun off = mlp_overlap(g, sp, 0, seq), on = mlp_overlap(g, sp, splits, seq);
        expect_counts(off.forward_delta, sp ? counts(0, 1, 1) : counts(1, 0, 0), "off");
        expect_counts(on.forward_delta, sp ? counts(0, pieces, pieces) : counts(pieces, 0, 0),
                      "on");
        std::vector<at::Tensor> a{on.mlp.y, on.mlp.x_grad}, b{off.mlp.y, off.mlp.x_grad};
        a.insert(a.end(), on.mlp.grads.begin(), on.mlp.grads.end());
        b.insert(b.end(), off.mlp.grads.begin(), off.mlp.grads.end());
        for (size_t i = 0; i < a.size(); ++i) {
          EXPECT_TRUE(rel_close(a[i], b[i], 1e-6)) << "value " << i;
          bitwise += at::equal(a[i], b[i]);
          ++compared;
        }
      }
  // Not asserted (BLAS may block a smaller product differently): how often the bits agree.
  std::printf("tp_comm_overlap: %d of %d tensors bit-equal to the one-collective path\n", bitwise,
              compared);
}

// The column layer's pipelined all-gather: piece j+1 issued before piece j is waited for and
// multiplied; each gathered piece a fresh collective.
TEST(TensorParallelOverlap, TpCommOverlapForwardStepOrder) {
  using Trace = std::vector<std::string>;
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    ColumnParallelLinear fc(ParallelLinearOptions(kHidden, kFfn)
                                .sequence_parallel(true)
                                .tp_comm_overlap(true)
                                .tp_comm_overlap_num_splits(3),
                            g.group);
    const int64_t rows = 3;
    const at::Tensor x = draw({rows * g.t(), kBatch, kHidden}, 91, at::kFloat);
    const at::Tensor shard = chunk(x, 0, g);
    Trace trace;
    dscpp::nn::set_async_communication_trace(&trace);
    at::Tensor y = fc(shard).first;
    dscpp::nn::set_async_communication_trace(nullptr);
    EXPECT_EQ(trace,
              (Trace{"issue all_gather piece", "issue all_gather piece", "wait all_gather piece",
                     "product piece", "issue all_gather piece", "wait all_gather piece",
                     "product piece", "wait all_gather piece", "product piece"}));
    // Against the whole sequence's product: each row in its place of the gathered output.
    at::Tensor want = at::addmm(fc->bias.to(at::kDouble), x.reshape({-1, kHidden}).to(at::kDouble),
                                fc->weight.to(at::kDouble).t());
    EXPECT_TRUE(rel_close(y.reshape({-1, y.size(-1)}), want, 1e-6));
  }
}

TEST(TensorParallelOverlap, TpCommOverlapRefusals) {
  using Pieces = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(dscpp::nn::tp_comm_overlap_pieces(7, 3), (Pieces{{0, 3}, {3, 2}, {5, 2}}));
  EXPECT_EQ(dscpp::nn::tp_comm_overlap_pieces(2, 5), (Pieces{{0, 1}, {1, 1}}));
  EXPECT_EQ(dscpp::nn::tp_comm_overlap_pieces(4, 1), (Pieces{{0, 4}}));
  const auto& g = model_groups().front();
  auto expect_error = [](auto&& make, const std::string& needle) {
    try {
      make();
      ADD_FAILURE() << "no error; wanted one naming " << needle;
    } catch (const dscpp::nn::TensorParallelError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(
      [&] {
        ColumnParallelLinear(ParallelLinearOptions(kHidden, kFfn)
                                 .tp_comm_overlap(true)
                                 .tp_comm_overlap_num_splits(0),
                             g.group);
      },
      "tp_comm_overlap_num_splits must be at least 1, found 0");
  expect_error(
      [&] {
        RowParallelLinear(ParallelLinearOptions(kFfn, kHidden)
                              .tp_comm_overlap(true)
                              .tp_comm_overlap_num_splits(-1),
                          g.group);
      },
      "RowParallelLinear: tp_comm_overlap_num_splits");
  expect_error(
      [&] {
        ColumnParallelLinear(ParallelLinearOptions(kHidden, kFfn)
                                 .tp_comm_overlap(true)
                                 .async_tensor_model_parallel_allreduce(false),
                             g.group);
      },
      "tp_comm_overlap needs async_tensor_model_parallel_allreduce");
  expect_error(
      [&] {
        RowParallelLinear proj(ParallelLinearOptions(kFfn, kHidden)
                                   .input_is_parallel(true)
                                   .sequence_parallel(true)
                                   .tp_comm_overlap(true),
                               g.group);
        proj(draw({kSeq * g.t() + 1, kBatch, kFfn / g.t()}, 92, at::kFloat));
      },
      "sequence shards");
}

}  // namespace
