// nn::moe::expert_parameters (nn/moe/expert_params.h): which state_dict names of a module are
// expert parameters, with their MoE layer, local expert, ep_size and ep_rank, written out by
// hand for a tiny model of two MoE layers (clones of an ExpertMLP at ep_size 2 with a shared
// expert and a residual MLP; a GroupedMLP at ep_size 1 inside a child module), and for an MoE
// layer as the root (with and without a prefix). The expert-parallel group is a no-op group
// of 2 ranks (rank 1): the fields only read its rank, nothing communicates.
#include <gtest/gtest.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>

#include <map>
#include <set>
#include <string>

#include "dscpp/comm/no_op_group.h"
#include "dscpp/nn/moe/expert_params.h"
#include "dscpp/nn/moe/moe.h"

namespace moe = dscpp::nn::moe;
using torch::nn::AnyModule;

namespace {

constexpr int64_t kHidden = 8, kFfn = 16;

moe::MoEOptions clones_ep2() {
  return moe::MoEOptions(kHidden)
      .num_experts(4)
      .ep_size(2)
      .ep_group(dscpp::comm::make_no_op_group(/*rank=*/1, /*size=*/2))
      .expert(AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(kHidden, kFfn))))
      .shared_expert(AnyModule(moe::ExpertMLP(moe::ExpertMLPOptions(kHidden, kFfn))))
      .use_residual(true);
}

moe::MoEOptions grouped_ep1() {
  return moe::MoEOptions(kHidden).num_experts(4).ffn_hidden_size(kFfn);
}

struct InnerImpl : torch::nn::Module {
  InnerImpl() { layer = register_module("moe", moe::MoE(grouped_ep1())); }
  moe::MoE layer{nullptr};
};
TORCH_MODULE(Inner);

// Registration order: fc, moe1, inner (DeepSpeed's moe_layer_id follows it).
struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc = register_module("fc", torch::nn::Linear(kHidden, kHidden));
    moe1 = register_module("moe1", moe::MoE(clones_ep2()));
    inner = register_module("inner", Inner());
  }
  torch::nn::Linear fc{nullptr};
  moe::MoE moe1{nullptr};
  Inner inner{nullptr};
};
TORCH_MODULE(Net);

void expect_param(const std::map<std::string, moe::ExpertParam>& got, const std::string& name,
                  int layer, int local_expert, int64_t num_local, int64_t ep_size,
                  int64_t ep_rank) {
  auto it = got.find(name);
  ASSERT_NE(it, got.end()) << name << " is not listed as an expert parameter";
  EXPECT_EQ(it->second.moe_layer, layer) << name;
  EXPECT_EQ(it->second.local_expert, local_expert) << name;
  EXPECT_EQ(it->second.num_local_experts, num_local) << name;
  EXPECT_EQ(it->second.ep_size, ep_size) << name;
  EXPECT_EQ(it->second.ep_rank, ep_rank) << name;
}

TEST(MoEExpertParameters, NamesClonedAndGroupedExpertsWithTheirLayerAndRank) {
  Net net;
  const auto got = moe::expert_parameters(*net);
  // moe1: 4 experts over ep 2, so 2 local clones here (rank 1 holds global experts 2 and 3),
  // each fc1 / fc2 with weight and bias.
  for (int e = 0; e < 2; ++e)
    for (const char* p : {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
      expect_param(got,
                   "moe1.deepspeed_moe.experts.deepspeed_experts." + std::to_string(e) + "." + p,
                   /*layer=*/0, /*local_expert=*/e, /*num_local=*/2, /*ep_size=*/2, /*ep_rank=*/1);
  // inner.moe: a GroupedMLP at ep 1, its weights stacked over all 4 experts.
  for (const char* p : {"weight1", "weight2"})
    expect_param(got, std::string("inner.moe.deepspeed_moe.experts.") + p, /*layer=*/1,
                 /*local_expert=*/-1, /*num_local=*/4, /*ep_size=*/1, /*ep_rank=*/0);
  EXPECT_EQ(got.size(), 8u + 2u);
  // Everything else is dense: the gates, the shared expert, the residual MLP and coefficient,
  // the plain linear.
  std::set<std::string> dense;
  for (const auto& p : net->named_parameters())
    if (!got.count(p.key())) dense.insert(p.key());
  const std::set<std::string> want = {
      "fc.weight",
      "fc.bias",
      "moe1.deepspeed_moe.gate.wg.weight",
      "moe1.mlp.fc1.weight",
      "moe1.mlp.fc1.bias",
      "moe1.mlp.fc2.weight",
      "moe1.mlp.fc2.bias",
      "moe1.coefficient.weight",
      "moe1.coefficient.bias",
      "moe1.shared_experts.fc1.weight",
      "moe1.shared_experts.fc1.bias",
      "moe1.shared_experts.fc2.weight",
      "moe1.shared_experts.fc2.bias",
      "inner.moe.deepspeed_moe.gate.wg.weight",
  };
  EXPECT_EQ(dense, want);
  // Each listed name is one of the module's parameters.
  const auto params = net->named_parameters();
  for (const auto& [name, e] : got) EXPECT_NE(params.find(name), nullptr) << name;
}

TEST(MoEExpertParameters, AnMoELayerAsTheRootWithAndWithoutAPrefix) {
  moe::MoE layer(grouped_ep1());
  const auto bare = moe::expert_parameters(*layer);
  ASSERT_EQ(bare.size(), 2u);
  expect_param(bare, "deepspeed_moe.experts.weight1", 0, -1, 4, 1, 0);
  expect_param(bare, "deepspeed_moe.experts.weight2", 0, -1, 4, 1, 0);
  const auto prefixed = moe::expert_parameters(*layer, "model");
  ASSERT_EQ(prefixed.size(), 2u);
  expect_param(prefixed, "model.deepspeed_moe.experts.weight1", 0, -1, 4, 1, 0);
  expect_param(prefixed, "model.deepspeed_moe.experts.weight2", 0, -1, 4, 1, 0);
}

TEST(MoEExpertParameters, AModuleWithoutMoELayersHasNone) {
  torch::nn::Linear plain(kHidden, kHidden);
  EXPECT_TRUE(moe::expert_parameters(*plain).empty());
}

}  // namespace
