// The tensor-parallel layers on each model group against a float64 one-rank rebuild of the
// unsharded math (Y = X Wᵀ + b, the embedding lookup), forward values and the gradients of
// the input, weight and bias, at 1e-5 relative; the initialisation's slices bit-equal to the
// one-rank weight; sequence parallelism on ≡ off.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include "dscpp/nn/parallel_linear.h"
#include "dscpp/nn/vocab_parallel_embedding.h"
#include "tp_test_util.h"

using dscpp::nn::ColumnParallelLinear;
using dscpp::nn::ParallelLinearOptions;
using dscpp::nn::RowParallelLinear;
using dscpp::nn::VocabParallelEmbedding;
using tp_test::chunk;
using tp_test::draw;
using tp_test::model_groups;
using tp_test::rel_close;

namespace {

void assign(const at::Tensor& param, const at::Tensor& value) {
  at::NoGradGuard no_grad;
  param.copy_(value);
}

at::Tensor f64_leaf(const at::Tensor& t) {
  return t.detach().to(at::kDouble).requires_grad_();
}

at::Tensor f32_leaf(const at::Tensor& t) {
  return t.detach().clone().requires_grad_();
}

TEST(TensorParallelLinear, ColumnParallelMatchesOneRankFloat64) {
  const int64_t in = 16, out = 48;  // out splits over 2, 4 and 8 ranks
  for (const auto& g : model_groups())
    for (bool gather : {false, true})
      for (bool skip : {false, true}) {
        SCOPED_TRACE(g.name + (gather ? " gather_output" : "") + (skip ? " skip_bias_add" : ""));
        const auto opts = ParallelLinearOptions(in, out).gather_output(gather).skip_bias_add(skip);
        at::manual_seed(11);
        ColumnParallelLinear col(opts, g.group);
        at::manual_seed(11);
        ColumnParallelLinear one(opts, nullptr);
        // The master weight drawn whole: t ranks hold the one-rank weight's rows, bit for bit.
        EXPECT_TRUE(at::equal(col->weight, chunk(one->weight, 0, g)));
        const at::Tensor b = draw({out}, 2, at::kFloat);
        assign(col->bias, chunk(b, 0, g));

        const at::Tensor x = draw({3, 5, in}, 3, at::kFloat).requires_grad_();
        const at::Tensor R = draw({3, 5, out}, 4, at::kFloat);
        auto [y, y_bias] = col(x);
        (y * (gather ? R : chunk(R, -1, g))).sum().backward();

        const at::Tensor X = f64_leaf(x), W = f64_leaf(one->weight), B = f64_leaf(b);
        at::Tensor Y = at::matmul(X, W.t());
        if (!skip) Y = Y + B;
        (Y * R.to(at::kDouble)).sum().backward();

        EXPECT_TRUE(rel_close(y, gather ? Y : chunk(Y, -1, g)));
        EXPECT_TRUE(rel_close(x.grad(), X.grad()));
        EXPECT_TRUE(rel_close(col->weight.grad(), chunk(W.grad(), 0, g)));
        if (skip) {
          EXPECT_TRUE(y_bias.is_same(col->bias));
          EXPECT_FALSE(col->bias.grad().defined());
        } else {
          EXPECT_FALSE(y_bias.defined());
          EXPECT_TRUE(rel_close(col->bias.grad(), chunk(B.grad(), 0, g)));
        }
      }
}

TEST(TensorParallelLinear, RowParallelMatchesOneRankFloat64) {
  const int64_t in = 48, out = 12;
  for (const auto& g : model_groups())
    for (bool input_is_parallel : {false, true}) {
      SCOPED_TRACE(g.name + (input_is_parallel ? " input_is_parallel" : ""));
      const auto opts = ParallelLinearOptions(in, out).input_is_parallel(input_is_parallel);
      at::manual_seed(12);
      RowParallelLinear row(opts, g.group);
      at::manual_seed(12);
      RowParallelLinear one(opts, nullptr);
      EXPECT_TRUE(at::equal(row->weight, chunk(one->weight, 1, g)));
      const at::Tensor b = draw({out}, 5, at::kFloat);
      assign(row->bias, b);

      const at::Tensor x = draw({3, 5, in}, 6, at::kFloat);
      const at::Tensor x_in = f32_leaf(input_is_parallel ? chunk(x, -1, g) : x);
      const at::Tensor R = draw({3, 5, out}, 7, at::kFloat);
      at::Tensor y = row(x_in).first;
      (y * R).sum().backward();

      const at::Tensor X = f64_leaf(x), W = f64_leaf(one->weight), B = f64_leaf(b);
      const at::Tensor Y = at::matmul(X, W.t()) + B;
      (Y * R.to(at::kDouble)).sum().backward();

      EXPECT_TRUE(rel_close(y, Y));
      EXPECT_TRUE(rel_close(x_in.grad(), input_is_parallel ? chunk(X.grad(), -1, g) : X.grad()));
      EXPECT_TRUE(rel_close(row->weight.grad(), chunk(W.grad(), 1, g)));
      EXPECT_TRUE(rel_close(row->bias.grad(), B.grad()));
    }
}

TEST(TensorParallelLinear, SequenceParallelLinearsMatchOneRankFloat64) {
  // Sequence-first activations [s, b, h]: s = 8 splits over 2 and 4 ranks.
  const int64_t s = 8, batch = 2, h = 16, ffn = 48;
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    // Column: this rank's sequence shard in, all of the sequence's columns out.
    const auto copts = ParallelLinearOptions(h, ffn).sequence_parallel(true);
    at::manual_seed(21);
    ColumnParallelLinear col(copts, g.group);
    at::manual_seed(21);
    ColumnParallelLinear col_one(copts, nullptr);
    const at::Tensor cb = draw({ffn}, 8, at::kFloat);
    assign(col->bias, chunk(cb, 0, g));
    const at::Tensor x = draw({s, batch, h}, 9, at::kFloat);
    const at::Tensor x_shard = f32_leaf(chunk(x, 0, g));
    const at::Tensor R = draw({s, batch, ffn}, 10, at::kFloat);
    at::Tensor y = col(x_shard).first;
    (y * chunk(R, -1, g)).sum().backward();
    const at::Tensor X = f64_leaf(x), W = f64_leaf(col_one->weight), B = f64_leaf(cb);
    const at::Tensor Y = at::matmul(X, W.t()) + B;
    (Y * R.to(at::kDouble)).sum().backward();
    EXPECT_TRUE(rel_close(y, chunk(Y, -1, g)));
    EXPECT_TRUE(rel_close(x_shard.grad(), chunk(X.grad(), 0, g)));
    EXPECT_TRUE(rel_close(col->weight.grad(), chunk(W.grad(), 0, g)));
    EXPECT_TRUE(rel_close(col->bias.grad(), chunk(B.grad(), 0, g)));

    // Row: split columns in, this rank's sequence shard out (reduce-scattered).
    const auto ropts =
        ParallelLinearOptions(ffn, h).input_is_parallel(true).sequence_parallel(true);
    at::manual_seed(22);
    RowParallelLinear row(ropts, g.group);
    at::manual_seed(22);
    RowParallelLinear row_one(ropts, nullptr);
    const at::Tensor rb = draw({h}, 11, at::kFloat);
    assign(row->bias, rb);
    const at::Tensor u = draw({s, batch, ffn}, 12, at::kFloat);
    const at::Tensor u_in = f32_leaf(chunk(u, -1, g));
    const at::Tensor Q = draw({s, batch, h}, 13, at::kFloat);
    at::Tensor z = row(u_in).first;
    (z * chunk(Q, 0, g)).sum().backward();
    // The replicated bias saw 1/t of the tokens here: summed over the group, it is whole.
    EXPECT_TRUE(row->tensor_parallel_attributes().at("bias").sequence_parallel);
    dscpp::nn::all_reduce_sequence_parallel_grads(*row, g.group);
    const at::Tensor U = f64_leaf(u), W2 = f64_leaf(row_one->weight), B2 = f64_leaf(rb);
    const at::Tensor Z = at::matmul(U, W2.t()) + B2;
    (Z * Q.to(at::kDouble)).sum().backward();
    EXPECT_TRUE(rel_close(z, chunk(Z, 0, g)));
    EXPECT_TRUE(rel_close(u_in.grad(), chunk(U.grad(), -1, g)));
    EXPECT_TRUE(rel_close(row->weight.grad(), chunk(W2.grad(), 1, g)));
    EXPECT_TRUE(rel_close(row->bias.grad(), B2.grad()));
  }
}

// A Megatron MLP (column, GeLU, row) with and without sequence parallelism: the same outputs
// (the shards of the whole), input gradients and weight gradients.
TEST(TensorParallelLinear, SequenceParallelOnEqualsOff) {
  const int64_t s = 8, batch = 2, h = 16, ffn = 32;
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    auto build = [&](bool sp) {
      at::manual_seed(31);
      ColumnParallelLinear fc(ParallelLinearOptions(h, ffn).sequence_parallel(sp), g.group);
      RowParallelLinear proj(
          ParallelLinearOptions(ffn, h).input_is_parallel(true).sequence_parallel(sp), g.group);
      assign(fc->bias, chunk(draw({ffn}, 14, at::kFloat), 0, g));
      assign(proj->bias, draw({h}, 15, at::kFloat));
      return std::make_pair(fc, proj);
    };
    auto [fc_on, proj_on] = build(true);
    auto [fc_off, proj_off] = build(false);
    const at::Tensor x = draw({s, batch, h}, 16, at::kFloat);
    const at::Tensor R = draw({s, batch, h}, 17, at::kFloat);

    const at::Tensor x_on = f32_leaf(chunk(x, 0, g));
    at::Tensor y_on = proj_on(at::gelu(fc_on(x_on).first)).first;
    (y_on * chunk(R, 0, g)).sum().backward();
    dscpp::nn::all_reduce_sequence_parallel_grads(*proj_on, g.group);

    const at::Tensor x_off = f32_leaf(x);
    at::Tensor y_off = proj_off(at::gelu(fc_off(x_off).first)).first;
    (y_off * R).sum().backward();

    EXPECT_TRUE(rel_close(y_on, chunk(y_off, 0, g)));
    EXPECT_TRUE(rel_close(x_on.grad(), chunk(x_off.grad(), 0, g)));
    EXPECT_TRUE(rel_close(fc_on->weight.grad(), fc_off->weight.grad()));
    EXPECT_TRUE(rel_close(fc_on->bias.grad(), fc_off->bias.grad()));
    EXPECT_TRUE(rel_close(proj_on->weight.grad(), proj_off->weight.grad()));
    EXPECT_TRUE(rel_close(proj_on->bias.grad(), proj_off->bias.grad()));
  }
}

TEST(VocabParallelEmbedding, MatchesOneRankFloat64WithAndWithoutSequenceParallel) {
  const int64_t vocab = 32, dim = 8, batch = 2, s = 8;
  for (const auto& g : model_groups())
    for (bool sp : {false, true}) {
      SCOPED_TRACE(g.name + (sp ? " reduce_scatter_embeddings" : ""));
      at::manual_seed(41);
      VocabParallelEmbedding emb(vocab, dim, g.group, dscpp::nn::init_method_normal(), sp);
      at::manual_seed(41);
      VocabParallelEmbedding one(vocab, dim, nullptr);
      EXPECT_TRUE(at::equal(emb->weight, chunk(one->weight, 0, g)));
      EXPECT_EQ(emb->vocab_start_index, g.r() * vocab / g.t());
      const at::Tensor tokens =
          at::randint(0, vocab, {batch, s}, at::detail::createCPUGenerator(42), at::kLong);
      const at::Tensor R = draw({batch, s, dim}, 43, at::kFloat);
      at::Tensor y = emb(tokens);
      // With sequence parallelism: this rank's [s/t, b, dim] of the sequence-first output.
      const at::Tensor r_local = sp ? chunk(R.transpose(0, 1), 0, g) : R;
      (y * r_local).sum().backward();

      const at::Tensor W = f64_leaf(one->weight);
      const at::Tensor Y = at::embedding(W, tokens);
      (Y * R.to(at::kDouble)).sum().backward();
      EXPECT_TRUE(rel_close(y, sp ? chunk(Y.transpose(0, 1), 0, g) : Y));
      EXPECT_TRUE(rel_close(emb->weight.grad(), chunk(W.grad(), 0, g)));
    }
}

// Megatron's partition stride: the full rows cut into t·stride pieces, rank r holding
// pieces r, r + t, ... (a fused QKV keeps each rank's q, k and v rows together).
TEST(TensorParallelLayers, StridedPartitionHoldsInterleavedPieces) {
  const int64_t stride = 2, in = 8, out = 48;
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    const auto opts = ParallelLinearOptions(in, out).stride(stride);
    at::manual_seed(71);
    ColumnParallelLinear col(opts, g.group);
    at::manual_seed(71);
    ColumnParallelLinear one(opts, nullptr);
    const int64_t piece = out / (g.t() * stride);
    const at::Tensor want = at::cat({one->weight.narrow(0, g.r() * piece, piece),
                                     one->weight.narrow(0, (g.r() + g.t()) * piece, piece)});
    EXPECT_TRUE(at::equal(col->weight, want));
    EXPECT_EQ(col->tensor_parallel_attributes().at("weight").partition_stride, stride);
  }
}

TEST(TensorParallelLayers, AttributesDescribeEachParameterOnce) {
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    auto root_ptr = std::make_shared<torch::nn::Module>();
    torch::nn::Module& root = *root_ptr;
    root.register_module("emb", VocabParallelEmbedding(32, 8, g.group).ptr());
    root.register_module("fc", ColumnParallelLinear(ParallelLinearOptions(8, 16), g.group).ptr());
    root.register_module(
        "proj",
        RowParallelLinear(ParallelLinearOptions(16, 8).input_is_parallel(true), g.group).ptr());
    root.register_parameter("norm_weight", at::ones({8}));
    const auto attrs = dscpp::nn::tensor_parallel_attributes(root);
    ASSERT_EQ(attrs.size(), 6u);
    EXPECT_TRUE(attrs.at("emb.weight").tensor_model_parallel);
    EXPECT_EQ(attrs.at("emb.weight").partition_dim, 0);
    EXPECT_EQ(attrs.at("fc.weight").partition_dim, 0);
    EXPECT_EQ(attrs.at("fc.bias").partition_dim, 0);
    EXPECT_EQ(attrs.at("proj.weight").partition_dim, 1);
    EXPECT_FALSE(attrs.at("proj.bias").tensor_model_parallel);
    EXPECT_FALSE(attrs.at("norm_weight").tensor_model_parallel);
    // Each rank holds 1/t of every split parameter; a replica counts on rank 0 only.
    int64_t split = 0;
    for (const auto& p : root.named_parameters())
      if (attrs.at(p.key()).tensor_model_parallel) split += p.value().numel();
    EXPECT_EQ(split * g.t(), 32 * 8 + 16 * 8 + 16 + 8 * 16);
    for (const auto& [name, attr] : attrs)
      EXPECT_EQ(dscpp::nn::param_is_not_tensor_parallel_duplicate(attr, g.r()),
                attr.tensor_model_parallel || g.r() == 0)
          << name;
  }
}

TEST(TensorParallelLayers, SizesThatDoNotSplitAreNamed) {
  for (const auto& g : model_groups()) {
    SCOPED_TRACE(g.name);
    try {
      ColumnParallelLinear(ParallelLinearOptions(8, 10 * g.t() + 1), g.group);
      ADD_FAILURE() << "no error";
    } catch (const dscpp::nn::TensorParallelError& e) {
      EXPECT_NE(std::string(e.what()).find("output_size " + std::to_string(10 * g.t() + 1)),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(VocabParallelEmbedding(10 * g.t() + 1, 4, g.group),
                 dscpp::nn::TensorParallelError);
    EXPECT_THROW(RowParallelLinear(ParallelLinearOptions(8, 8).sequence_parallel(true), g.group),
                 dscpp::nn::TensorParallelError);
  }
}

}  // namespace
