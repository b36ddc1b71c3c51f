// vocab_parallel_cross_entropy on each model group against torch's cross entropy
// (at::cross_entropy_loss, float64) on the whole logits: the per-token loss and the gradient of
// this rank's columns, at 1e-5 relative; and the collectives it runs (counted on the group):
// three all-reduces of one value per token, no all-gather, nothing in backward.
#include <ATen/ATen.h>
#include <ATen/core/Reduction.h>
#include <gtest/gtest.h>

#include "dscpp/nn/vocab_parallel_cross_entropy.h"
#include "tp_test_util.h"

using tp_test::chunk;
using tp_test::draw;
using tp_test::model_groups;
using tp_test::rel_close;

namespace {

struct Counts {
  int64_t all_reduce_calls, all_reduce_elements, all_gather_calls, reduce_scatter_calls;
};

Counts counts(const dscpp::comm::ProcessGroup& g) {
  return {g.issued("all_reduce").calls, g.issued("all_reduce").elements,
          g.issued("all_gather").calls, g.issued("reduce_scatter").calls};
}

TEST(VocabParallelCrossEntropy, MatchesTorchOnTheGatheredLogitsWithoutGatheringThem) {
  const int64_t batch = 3, s = 5, vocab = 32, tokens = batch * s;
  for (const auto& g : model_groups())
    for (double scale : {1.0, 30.0}) {  // 30: logits far from 0, where the max matters
      SCOPED_TRACE(g.name + " scale " + std::to_string(scale));
      const at::Tensor logits = draw({batch, s, vocab}, 51, at::kFloat) * scale;
      const at::Tensor target =
          at::randint(0, vocab, {batch, s}, at::detail::createCPUGenerator(52), at::kLong);
      const at::Tensor w = draw({batch, s}, 53, at::kFloat);
      const at::Tensor shard = chunk(logits, -1, g).requires_grad_();

      const Counts before = counts(*g.group);
      at::Tensor loss = dscpp::nn::vocab_parallel_cross_entropy(shard, target, g.group);
      const Counts after_forward = counts(*g.group);
      (loss * w).sum().backward();
      const Counts after_backward = counts(*g.group);

      EXPECT_EQ(after_forward.all_reduce_calls - before.all_reduce_calls, 3);
      EXPECT_EQ(after_forward.all_reduce_elements - before.all_reduce_elements, 3 * tokens);
      EXPECT_EQ(after_forward.all_gather_calls, before.all_gather_calls);
      EXPECT_EQ(after_forward.reduce_scatter_calls, before.reduce_scatter_calls);
      EXPECT_EQ(after_backward.all_reduce_calls, after_forward.all_reduce_calls);
      EXPECT_EQ(after_backward.all_gather_calls, after_forward.all_gather_calls);

      const at::Tensor L = logits.to(at::kDouble).requires_grad_();
      const at::Tensor ref =
          at::cross_entropy_loss(L.view({-1, vocab}), target.view(-1), {}, at::Reduction::None)
              .view({batch, s});
      (ref * w.to(at::kDouble)).sum().backward();
      EXPECT_EQ(loss.scalar_type(), at::kFloat);
      EXPECT_TRUE(rel_close(loss, ref));
      EXPECT_TRUE(rel_close(shard.grad(), chunk(L.grad(), -1, g)));
    }
}

TEST(VocabParallelCrossEntropy, TargetsOutsideTheVocabularyAreNamed) {
  for (const auto& g : model_groups()) {
    const at::Tensor shard = at::zeros({4, 8});
    const at::Tensor target = at::tensor({0, 1, 8 * g.t(), 2}, at::kLong);
    try {
      dscpp::nn::vocab_parallel_cross_entropy(shard, target, g.group);
      ADD_FAILURE() << "no error";
    } catch (const dscpp::nn::TensorParallelError& e) {
      EXPECT_NE(std::string(e.what()).find("outside the vocabulary [0, " +
                                           std::to_string(8 * g.t()) + ")"),
                std::string::npos)
          << e.what();
    }
    EXPECT_THROW(dscpp::nn::vocab_parallel_cross_entropy(shard, at::zeros({3}, at::kLong), g.group),
                 dscpp::nn::TensorParallelError);
  }
}

}  // namespace
