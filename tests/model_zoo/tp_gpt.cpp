// TensorParallelGPT at t = world size (2 in the default run, 4 under tp_matrix) against
// model_zoo's GPT on one rank, computed in the same process: the initial weights are the
// one-rank weights' slices bit for bit, each rank holds 1/t of the split parameters, and 5 SGD
// steps through plain autograd give the same losses and weights (fp32, 1e-5 relative), with
// the tied embedding and with a separate head.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <iostream>

#include "dscpp/comm/rendezvous.h"
#include "dscpp/config/config_error.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/parallel_weight_init.h"
#include "dscpp/nn/tensor_parallel_attr.h"

namespace mz = dscpp::model_zoo;

namespace {

std::shared_ptr<dscpp::comm::ProcessGroup> world;

mz::GPTConfig tiny(bool tied, int t) {
  mz::GPTConfig c;
  c.hidden_size = 64;
  c.num_layers = 2;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 128;
  c.hidden_dropout = 0;
  c.attention_dropout = 0;
  c.tie_word_embeddings = tied;
  c.parallelism.tensor_model_parallel_size = t;
  return c;
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.detach().to(at::kDouble), w = want.detach().to(at::kDouble);
  return (g - w).abs().max().item<double>() / std::max(w.abs().max().item<double>(), 1e-30);
}

void sgd(torch::nn::Module& m, double lr) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.sub_(p.grad(), lr);
    p.mutable_grad().zero_();
  }
}

TEST(TensorParallelGPT, TrainsAsTheOneRankGPT) {
  const int t = world->size(), r = world->rank();
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied embedding" : "separate head");
    at::manual_seed(1);
    mz::GPT ref(tiny(tied, 1));
    at::manual_seed(1);
    mz::TensorParallelGPT tp(tiny(tied, t), world);

    const auto attrs = dscpp::nn::tensor_parallel_attributes(*tp);
    const auto ref_params = ref->named_parameters();
    ASSERT_EQ(attrs.size(), ref_params.size());
    int64_t split_here = 0, split_whole = 0;
    for (const auto& p : tp->named_parameters()) {
      const auto& a = attrs.at(p.key());
      const at::Tensor& whole = ref_params[p.key()];
      const at::Tensor want =
          a.tensor_model_parallel
              ? dscpp::nn::partition_of(whole, a.partition_dim, a.partition_stride, r, t)
              : whole;
      EXPECT_TRUE(at::equal(p.value(), want)) << p.key();
      if (a.tensor_model_parallel) {
        split_here += p.value().numel();
        split_whole += whole.numel();
      }
    }
    EXPECT_EQ(split_here * t, split_whole);  // 1/t of every split parameter on each rank

    // One batch, every step: the loss must fall as the model memorises it.
    const at::Tensor tokens =
        at::randint(0, 128, {4, 17}, at::detail::createCPUGenerator(7), at::kLong);
    std::vector<double> ref_losses, tp_losses;
    for (int step = 0; step < 5; ++step) {
      const at::Tensor ids = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
      at::Tensor l_ref = ref->loss(ref(ids), targets);
      l_ref.backward();
      sgd(*ref, 0.5);
      at::Tensor l_tp = tp->loss(tp(ids), targets);
      l_tp.backward();
      sgd(*tp, 0.5);
      ref_losses.push_back(l_ref.item<double>());
      tp_losses.push_back(l_tp.item<double>());
      EXPECT_LE(std::abs(tp_losses.back() - ref_losses.back()), 1e-5 * std::abs(ref_losses.back()))
          << "step " << step << ": " << tp_losses.back() << " vs " << ref_losses.back();
    }
    EXPECT_GT(ref_losses.front() - ref_losses.back(), 0.01);  // it did train
    for (const auto& p : tp->named_parameters()) {
      const auto& a = attrs.at(p.key());
      const at::Tensor& whole = ref_params[p.key()];
      const at::Tensor want =
          a.tensor_model_parallel
              ? dscpp::nn::partition_of(whole, a.partition_dim, a.partition_stride, r, t)
              : whole;
      EXPECT_LE(rel_err(p.value(), want), 1e-5) << p.key();
    }
  }
}

// parallelism.async_tensor_model_parallel_allreduce: the column-parallel layers and the tied
// head with their backward overlapped, or synchronous: the same loss and gradients, bit for
// bit, with and without sequence parallelism.
TEST(TensorParallelGPT, AsyncAllreduceOnAndOffGiveTheSameBits) {
  const int t = world->size();
  const at::Tensor tokens =
      at::randint(0, 128, {2, 17}, at::detail::createCPUGenerator(9), at::kLong);
  const at::Tensor ids = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  for (bool tied : {true, false})
    for (bool sp : {false, true}) {
      SCOPED_TRACE(std::string(tied ? "tied" : "head") + (sp ? " sequence_parallel" : ""));
      std::vector<at::Tensor> got[2];
      for (bool async : {false, true}) {
        mz::GPTConfig c = tiny(tied, t);
        c.parallelism.sequence_parallel = sp;
        c.parallelism.async_tensor_model_parallel_allreduce = async;
        at::manual_seed(3);
        mz::TensorParallelGPT tp(c, world);
        at::Tensor loss = tp->loss(tp(ids), targets);
        loss.backward();
        got[async].push_back(loss.detach());
        for (const auto& p : tp->parameters()) got[async].push_back(p.grad());
      }
      ASSERT_EQ(got[0].size(), got[1].size());
      for (size_t i = 0; i < got[0].size(); ++i) EXPECT_TRUE(at::equal(got[0][i], got[1][i])) << i;
    }
}

// parallelism.tp_comm_overlap: the forward collectives pipelined in 3 pieces (uneven on 8-row
// shards) against one collective each: the same loss and gradients within 1e-6 relative.
TEST(TensorParallelGPT, TpCommOverlapOnAndOffAgree) {
  const int t = world->size();
  const at::Tensor tokens =
      at::randint(0, 128, {2, 17}, at::detail::createCPUGenerator(11), at::kLong);
  const at::Tensor ids = tokens.narrow(1, 0, 16), targets = tokens.narrow(1, 1, 16);
  for (bool sp : {true, false}) {
    SCOPED_TRACE(sp ? "sequence_parallel" : "no sequence_parallel");
    std::vector<at::Tensor> got[2];
    int64_t forward_collectives[2] = {0, 0};  // all-gathers, reduce-scatters, all-reduces
    for (bool overlap : {false, true}) {
      mz::GPTConfig c = tiny(true, t);
      c.parallelism.sequence_parallel = sp;
      c.parallelism.tp_comm_overlap = overlap;
      c.parallelism.tp_comm_overlap_num_splits = 3;
      at::manual_seed(3);
      mz::TensorParallelGPT tp(c, world);
      auto calls = [] {
        return world->issued("all_gather").calls + world->issued("reduce_scatter").calls +
               world->issued("all_reduce").calls;
      };
      const int64_t before = calls();
      at::Tensor logits = tp(ids);
      forward_collectives[overlap] = calls() - before;
      at::Tensor loss = tp->loss(logits, targets);
      loss.backward();
      got[overlap].push_back(loss.detach());
      for (const auto& p : tp->parameters()) got[overlap].push_back(p.grad());
    }
    // Each overlapped collective became min(3, rows) pieces: the two row-parallel reductions
    // of each of the 2 blocks, and with sp the two column all-gathers of each block and the
    // tied head's. Rows: the sequence shard 16/t, or without sp dim 0 of [b, s, h], b = 2.
    const int64_t rows = sp ? 16 / t : 2, layers = sp ? 4 * 2 + 1 : 2 * 2;
    EXPECT_EQ(forward_collectives[1] - forward_collectives[0],
              layers * (std::min<int64_t>(3, rows) - 1));
    ASSERT_EQ(got[0].size(), got[1].size());
    for (size_t i = 0; i < got[0].size(); ++i) EXPECT_LE(rel_err(got[1][i], got[0][i]), 1e-6) << i;
  }
}

TEST(TensorParallelGPT, ADegreeThatDoesNotDivideIsAConfigError) {
  mz::GPTConfig c = tiny(true, world->size());
  c.vocab_size = 128 * world->size() + 1;
  try {
    mz::TensorParallelGPT tp(c, world);
    ADD_FAILURE() << "no error";
  } catch (const dscpp::ConfigError& e) {
    EXPECT_EQ(e.path(), "vocab_size") << e.what();
  }
  c = tiny(true, 1);
  EXPECT_THROW(mz::TensorParallelGPT(c, world), dscpp::ConfigError);
}

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  dscpp::comm::InitOptions options;
  options.backend = "gloo";
  options.timeout = std::chrono::seconds(60);
  world = dscpp::comm::init_distributed(options);
  const int rc = RUN_ALL_TESTS();
  world->barrier().wait();
  world.reset();
  return rc;
}
