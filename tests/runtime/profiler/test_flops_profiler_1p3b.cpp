// (a) The GPT of 1.31 B (model_zoo/configs/gpt_1.3B.json), fp32 on the CPU, one sequence of
// 32 tokens: the profiler's forward MACs are exactly those of a hand count of its matrix
// products and attention, and its forward flops within 1% of twice them. About 5.3 GB of
// parameters; its own executable, so ctest can run it alone.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "dscpp/model_zoo/gpt.h"
#include "dscpp/runtime/profiler/flops_profiler.h"
#include "tests/runtime/profiler/gpt_hand_count.h"

TEST(FlopsProfiler, GPT1p3BForwardFlopsWithinOnePercentOfItsMatrixProducts) {
  auto cfg = dscpp::model_zoo::GPTConfig::from_file(std::string(DSCPP_SOURCE_DIR) +
                                                    "/model_zoo/configs/gpt_1.3B.json");
  const int64_t batch = 1, seq = 32;
  torch::manual_seed(0);
  dscpp::model_zoo::GPT gpt(cfg);
  ASSERT_NEAR(static_cast<double>(cfg.num_parameters()), 1.31e9, 0.01e9);
  gpt->eval();  // dropout off, as the hand count has it
  at::NoGradGuard no_grad;
  dscpp::profiler::FlopsProfiler prof(*gpt);
  prof.start_profile();
  gpt->forward(at::randint(cfg.vocab_size, {batch, seq}, at::kLong));
  prof.stop_profile();
  const auto hand = gpt_hand_count(cfg, batch, seq);
  EXPECT_EQ(prof.get_total_macs(), hand.matmul_macs + hand.attention_macs);
  const double products = 2.0 * static_cast<double>(hand.matmul_macs + hand.attention_macs);
  EXPECT_NEAR(static_cast<double>(prof.get_total_flops()) / products, 1.0, 0.01)
      << prof.get_total_flops() << " flops against " << products;
  EXPECT_EQ(prof.get_total_params(), cfg.num_parameters());
}
