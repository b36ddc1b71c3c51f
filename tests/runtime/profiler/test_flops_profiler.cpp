// The flops profiler: its operator formulas against hand counts, its counting of the
// operators a forward actually runs (each once, none of backward's), the GPT's forward against
// a hand count of its matrix products, attention and elementwise work, the module tree it
// reports, DeepSpeed's number formatting, and the engine's flops_profiler section.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/layer_module.h"
#include "dscpp/ops/grouped_mm.h"
#include "dscpp/runtime/profiler/flops_profiler.h"
#include "dscpp/runtime/profiler/op_flops.h"
#include "dscpp/runtime/profiler/profile_report.h"
#include "tests/runtime/profiler/gpt_hand_count.h"

using dscpp::profiler::FlopsProfiler;
using dscpp::profiler::ModuleTree;
using dscpp::profiler::op_cost;
using nlohmann::json;

namespace {

int node_at(const ModuleTree& tree, const std::string& path) {
  for (size_t i = 0; i < tree.nodes().size(); ++i)
    if (tree.nodes()[i].path == path) return static_cast<int>(i);
  ADD_FAILURE() << "no module '" << path << "' in the tree";
  return 0;
}

dscpp::profiler::OpCost cost(const char* op, std::vector<c10::IValue> inputs) {
  auto c = op_cost(op, c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
  EXPECT_TRUE(c.has_value()) << op;
  return c.value_or(dscpp::profiler::OpCost{});
}

// A summary line as DeepSpeed lays it out: '{:<70}  {:<8}'.
std::string row(const std::string& label, const std::string& value) {
  return fmt::format("{:<70}  {:<8}\n", label, value);
}

std::string read(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST(FlopsProfiler, OperatorFormulasMatchHandCounts) {
  const at::Tensor a = at::zeros({4, 8}), b = at::zeros({8, 16}), bias = at::zeros({16});
  // A [4,8] x [8,16] product: 4*8*16 = 512 MACs, twice as many flops.
  EXPECT_EQ(cost("aten::mm", {a, b}).macs, 512);
  EXPECT_EQ(cost("aten::mm", {a, b}).flops, 1024);
  // addmm adds its input once per element (16 for a [16] bias, as DeepSpeed counts it).
  EXPECT_EQ(cost("aten::addmm", {bias, a, b}).flops, 1024 + 16);
  // linear: x [2,3,8] by weight [16,8]: 2*3*8*16 MACs; the bias is not counted.
  EXPECT_EQ(cost("dscpp::linear", {at::zeros({2, 3, 8}), at::zeros({16, 8}), bias}).flops,
            2 * 2 * 3 * 8 * 16);
  // The fp8 linear (nn/fp8_linear.h) counts the same products under its own name.
  EXPECT_EQ(cost("dscpp::fp8_linear", {at::zeros({2, 3, 8}), at::zeros({16, 8}), bias}).flops,
            2 * 2 * 3 * 8 * 16);
  // matmul broadcasting a [8,16] matrix over a batch of 5: 5*4*8*16 MACs.
  EXPECT_EQ(cost("aten::matmul", {at::zeros({5, 4, 8}), b}).macs, 5 * 4 * 8 * 16);
  EXPECT_EQ(cost("aten::matmul", {at::zeros({4, 8}), at::zeros({5, 8, 16})}).macs, 5 * 4 * 8 * 16);
  // Grouped products (the experts): rows [10, 16] in groups by weights [3, 16, 32]: each row
  // through one expert, 10*16*32 MACs; the weights' gradient, rows^T [16, 10] by grad [10, 32]
  // grouped along the 10 rows, as many; 3 batched [4, 16] x [16, 32], 3*4*16*32.
  const at::Tensor offs = at::zeros({3}, at::kInt);
  EXPECT_EQ(cost("aten::_grouped_mm", {at::zeros({10, 16}), at::zeros({3, 16, 32}), offs}).macs,
            10 * 16 * 32);
  EXPECT_EQ(cost("aten::_grouped_mm", {at::zeros({16, 10}), at::zeros({10, 32}), offs}).flops,
            2 * 10 * 16 * 32);
  EXPECT_EQ(cost("aten::_grouped_mm", {at::zeros({3, 4, 16}), at::zeros({3, 16, 32})}).macs,
            3 * 4 * 16 * 32);
  // Attention over q, k, v [2 batch, 4 heads, 16 positions, 8 dims]: scores 2*4*16*16*8 and
  // the weighted sum as many; the flash kernel's [B, S, H, D] layout gives the same.
  const at::Tensor q = at::zeros({2, 4, 16, 8});
  EXPECT_EQ(cost("aten::scaled_dot_product_attention", {q, q, q}).macs, 2 * 2 * 4 * 16 * 16 * 8);
  const at::Tensor qf = at::zeros({2, 16, 4, 8});
  EXPECT_EQ(cost("aten::_flash_attention_forward", {qf, qf, qf}).macs, 2 * 2 * 4 * 16 * 16 * 8);
  // layer_norm: 5 flops per element with a weight, 4 without.
  const at::Tensor x = at::zeros({3, 16});
  EXPECT_EQ(cost("aten::layer_norm", {x, c10::IValue(std::vector<int64_t>{16}), bias, bias}).flops,
            5 * 48);
  EXPECT_EQ(cost("aten::layer_norm",
                 {x, c10::IValue(std::vector<int64_t>{16}), c10::IValue(), c10::IValue()})
                .flops,
            4 * 48);
  // Elementwise over the broadcast shape ([2,3,4] + [4]: 24), a scalar operand adds nothing.
  EXPECT_EQ(cost("aten::add", {at::zeros({2, 3, 4}), at::zeros({4})}).flops, 24);
  EXPECT_EQ(cost("aten::mul", {at::zeros({2, 3, 4}), c10::IValue(2.0)}).flops, 24);
  EXPECT_EQ(cost("aten::softmax", {x, c10::IValue(int64_t{-1})}).flops, 48);
  EXPECT_EQ(cost("aten::sum", {x}).flops, 48);
  EXPECT_EQ(cost("dscpp::bias_gelu", {x, bias}).flops, 2 * 48);  // the add and the GELU
  EXPECT_EQ(cost("dscpp::add_layer_norm", {x, x, bias, bias}).flops, 6 * 48);  // add + LN
  EXPECT_EQ(cost("aten::dropout", {x, c10::IValue(0.1), c10::IValue(true)}).flops, 0);
  EXPECT_EQ(cost("aten::embedding", {at::zeros({50, 16}), at::zeros({3}, at::kLong)}).flops, 0);
  // conv2d of [1,3,8,8] by 16 filters of 3x3, padding 1: 8x8 outputs of 3*3*3 MACs per
  // filter, plus the bias over the 16x8x8 output.
  const std::vector<c10::IValue> conv = {at::zeros({1, 3, 8, 8}),
                                         at::zeros({16, 3, 3, 3}),
                                         bias,
                                         c10::IValue(std::vector<int64_t>{1, 1}),
                                         c10::IValue(std::vector<int64_t>{1, 1}),
                                         c10::IValue(std::vector<int64_t>{1, 1}),
                                         c10::IValue(int64_t{1})};
  EXPECT_EQ(cost("aten::conv2d", conv).macs, 16 * 64 * 27);
  EXPECT_EQ(cost("aten::conv2d", conv).flops, 2 * 16 * 64 * 27 + 16 * 64);
  // Views and copies have no formula: what they call (nothing) is counted.
  EXPECT_FALSE(op_cost("aten::view", {}).has_value());
}

namespace {
struct NetImpl : torch::nn::Module {
  NetImpl() { fc = register_module("fc", torch::nn::Linear(8, 16)); }
  at::Tensor forward(const at::Tensor& x, const at::Tensor& w) {
    return at::matmul(at::gelu(fc(x)), w).sum();
  }
  torch::nn::Linear fc{nullptr};
};
TORCH_MODULE(Net);
}  // namespace

TEST(FlopsProfiler, CountsEachOperatorRunOnceAndNoneOfBackward) {
  Net net;
  FlopsProfiler prof(*net);
  const at::Tensor x = at::randn({2, 2, 8}), w = at::randn({16, 2});
  prof.start_profile();
  at::Tensor loss = net->forward(x, w);
  prof.stop_profile();
  loss.backward();  // after stop: not counted
  // LibTorch's Linear on a 3-d input: matmul [2,2,8] x weight.t() [8,16] (512 MACs, 1024
  // flops; what it calls is not counted again), then += bias over [2,2,16] (64); gelu over
  // [2,2,16]: 64; matmul [2,2,16] x [16,2]: 128 MACs, 256 flops; the sum over [2,2,2]: 8.
  EXPECT_EQ(prof.get_total_macs(), 512 + 128);
  EXPECT_EQ(prof.get_total_flops(), 1024 + 64 + 64 + 256 + 8);
  // The product took a view of fc's weight and the add fc's bias: both are fc's; the rest
  // is the root's own.
  const int fc = node_at(prof.tree(), "fc");
  EXPECT_EQ(prof.tree().macs(fc), 512);
  EXPECT_EQ(prof.tree().flops(fc), 1024 + 64);
  EXPECT_EQ(prof.tree().counters_of(0).macs, 128);
  EXPECT_GT(prof.tree().duration(fc), 0);
  EXPECT_GE(prof.get_total_duration(), prof.tree().duration(fc));
  EXPECT_EQ(prof.get_total_params(), 8 * 16 + 16);
  // A second profile starts from zero.
  prof.start_profile();
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_flops(), 0);
}

// The experts' grouped product as the MoE layer runs it (ATen's _grouped_mm, which LibTorch
// runs on the CPU too): counted once, over every row, as the loop of per-expert products would be.
TEST(FlopsProfiler, GroupedExpertProductCountsEveryRowOnce) {
  Net net;
  FlopsProfiler prof(*net);
  const at::Tensor rows = at::randn({10, 16}), weights = at::randn({3, 16, 32});
  const at::Tensor counts = at::tensor({4, 0, 6}, at::kLong);
  ASSERT_TRUE(dscpp::ops::grouped_mm_uses_aten(rows, weights));
  prof.start_profile();
  at::Tensor out = dscpp::ops::grouped_mm(rows, weights, counts);
  prof.stop_profile();
  EXPECT_EQ(prof.get_total_macs(), 10 * 16 * 32);
  // The loop it stands for: 4 rows through expert 0, 6 through expert 2.
  EXPECT_TRUE(at::allclose(out, dscpp::ops::grouped_mm_loop(rows, weights, counts), 1e-5, 1e-5));
}

// (b) The tiny GPT, where the elementwise work is part of the count.
TEST(FlopsProfiler, TinyGPTForwardAgreesWithItsHandCount) {
  auto cfg = dscpp::model_zoo::GPTConfig::from_file(std::string(DSCPP_SOURCE_DIR) +
                                                    "/model_zoo/configs/gpt_tiny.json");
  const int64_t batch = 2, seq = 32;
  torch::manual_seed(0);
  dscpp::model_zoo::GPT gpt(cfg);
  FlopsProfiler prof(*gpt);
  const at::Tensor ids = at::randint(cfg.vocab_size, {batch, seq}, at::kLong);
  prof.start_profile();
  gpt->forward(ids);
  prof.stop_profile();
  const auto hand = gpt_hand_count(cfg, batch, seq);
  // The MACs are the matrix products' and attention's, exactly.
  EXPECT_EQ(prof.get_total_macs(), hand.matmul_macs + hand.attention_macs);
  // The flops: twice those, plus one per element of the elementwise work, as written out in
  // gpt_hand_count.h; and within 15% of the products alone.
  EXPECT_EQ(prof.get_total_flops(), hand.flops());
  const double products = 2.0 * static_cast<double>(hand.matmul_macs + hand.attention_macs);
  EXPECT_NEAR(static_cast<double>(prof.get_total_flops()) / products, 1.0, 0.15);
}

// (c) The module tree names the GPT's modules and counts each where it runs.
TEST(FlopsProfiler, ModuleTreeNamesTheModelsModules) {
  auto cfg = dscpp::model_zoo::GPTConfig::from_file(std::string(DSCPP_SOURCE_DIR) +
                                                    "/model_zoo/configs/gpt_tiny.json");
  const int64_t batch = 1, seq = 16, h = cfg.hidden_size, tokens = batch * seq;
  torch::manual_seed(0);
  dscpp::model_zoo::GPT gpt(cfg);
  FlopsProfiler prof(*gpt);
  prof.start_profile();
  gpt->forward(at::randint(cfg.vocab_size, {batch, seq}, at::kLong));
  prof.stop_profile();
  const ModuleTree& t = prof.tree();
  EXPECT_EQ(t.macs(node_at(t, "blocks.0.attn.qkv")), tokens * h * 3 * h);
  EXPECT_EQ(t.macs(node_at(t, "blocks.1.mlp.fc")), tokens * h * cfg.ffn_size());
  EXPECT_EQ(t.flops(node_at(t, "blocks.2.ln_1")), 5 * tokens * h);
  // attn's own: the attention products (its linears are its children's).
  const int attn = node_at(t, "blocks.3.attn");
  EXPECT_EQ(t.counters_of(attn).macs, 2 * batch * seq * seq * h);
  // The tied head runs in GPT's own forward: the root's own MACs.
  EXPECT_EQ(t.counters_of(0).macs, tokens * h * cfg.vocab_size);
  EXPECT_GT(t.duration(node_at(t, "blocks.0")), 0);

  dscpp::profiler::ReportOptions options;
  const std::string report = model_profile_report(t, options, std::nullopt);
  for (const char* line :
       {"GPT(\n", "  (embedding): GPTEmbedding(\n", "    (word): Embedding(",
        "    (position): Embedding(", "  (blocks): ModuleList(\n", "    (0): GPTBlock(\n",
        "      (ln_1): LayerNorm(", "      (attn): GPTAttention(\n", "        (qkv): Linear(",
        "        (proj): Linear(", "      (mlp): GPTMLP(\n", "        (fc): Linear(",
        "  (final_norm): LayerNorm(", ", (128,), eps=1e-05, elementwise_affine=True)",
        "Embedding(6.44 M = 88.83% Params"})
    EXPECT_NE(report.find(line), std::string::npos) << line << "\n" << report;

  // The same model as LayerSpecs: a scope per layer; the tied head runs in the embedding's.
  torch::manual_seed(0);
  dscpp::nn::LayerModule layered(dscpp::model_zoo::gpt_layer_specs(cfg));
  FlopsProfiler lprof(*layered);
  lprof.start_profile();
  layered->forward(at::randint(cfg.vocab_size, {batch, seq}, at::kLong));
  lprof.stop_profile();
  const ModuleTree& lt = lprof.tree();
  EXPECT_EQ(lprof.get_total_macs(), prof.get_total_macs());
  EXPECT_EQ(lt.macs(node_at(lt, "embedding")), tokens * h * cfg.vocab_size);
  EXPECT_EQ(lt.macs(node_at(lt, "blocks.0")), t.macs(node_at(t, "blocks.0")));
  EXPECT_EQ(lt.flops(node_at(lt, "final_norm")), 5 * tokens * h);
  EXPECT_EQ(lt.node(0).type, "LayerModule");
}

// (d) The MoE GPT's tree reaches inside the MoE layer: the router's and the experts' products
// are counted in their own modules (they were all the MoE block's own before their scopes).
TEST(FlopsProfiler, MoETreeCountsTheRouterAndTheExpertsInTheirModules) {
  auto cfg = dscpp::model_zoo::GPTConfig::from_file(std::string(DSCPP_SOURCE_DIR) +
                                                    "/model_zoo/configs/moe_tiny.yaml");
  const int64_t batch = 2, seq = 16, h = cfg.hidden_size, tokens = batch * seq;
  const int64_t experts = cfg.moe.num_experts, k = cfg.moe.moe_router_topk, f = cfg.moe_ffn_size();
  torch::manual_seed(0);
  dscpp::model_zoo::GPT gpt(cfg);
  FlopsProfiler prof(*gpt);
  dscpp::nn::AuxLossScope aux;  // the router's aux and z losses go there
  prof.start_profile();
  gpt->forward(at::randint(cfg.vocab_size, {batch, seq}, at::kLong));
  prof.stop_profile();
  const ModuleTree& t = prof.tree();
  int moe_blocks = 0;
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string mlp = fmt::format("blocks.{}.mlp", l);
    bool is_moe = false;
    for (const auto& node : t.nodes()) is_moe |= node.path == mlp + ".deepspeed_moe";
    if (!is_moe) continue;
    ++moe_blocks;
    const int layer = node_at(t, mlp + ".deepspeed_moe"),
              gate = node_at(t, mlp + ".deepspeed_moe.gate"),
              grouped = node_at(t, mlp + ".deepspeed_moe.experts");
    // Dropless top-k: every token's k routes through SwiGLU experts ([H, 2F] then [F, H]).
    EXPECT_EQ(t.macs(grouped), tokens * k * 3 * h * f) << mlp;
    EXPECT_EQ(t.macs(gate), tokens * h * experts) << mlp;
    EXPECT_EQ(t.macs(layer), t.macs(gate) + t.macs(grouped)) << mlp;
    EXPECT_EQ(t.macs(node_at(t, mlp)),
              t.macs(layer) + tokens * 3 * h * cfg.moe.moe_shared_expert_intermediate_size)
        << mlp;
    EXPECT_GT(t.duration(gate), 0) << mlp;
    EXPECT_GT(t.duration(grouped), 0) << mlp;
  }
  EXPECT_EQ(moe_blocks, cfg.num_layers / 2);
}

TEST(FlopsProfiler, ReportFormatsNumbersAsDeepSpeed) {
  // Figures as DeepSpeed 0.19.8 printed them for the tiny GPT (ds_flops_profile.py).
  using namespace dscpp::profiler;
  EXPECT_EQ(params_to_string(7254784), "7.25 M");
  EXPECT_EQ(params_to_string(256), "256");
  EXPECT_EQ(params_to_string(1.3124e9), "1.31 B");
  EXPECT_EQ(macs_to_string(25690112), "25.69 MMACs");
  EXPECT_EQ(macs_to_string(524288), "524.29 KMACs");
  EXPECT_EQ(macs_to_string(0), "0 MACs");
  EXPECT_EQ(number_to_string(51630000), "51.63 M");
  EXPECT_EQ(duration_to_string(0.27057), "270.57 ms");
  EXPECT_EQ(duration_to_string(1.3412), "1.34 s");
  EXPECT_EQ(duration_to_string(351.43e-6), "351.43 us");
  EXPECT_EQ(flops_to_string(0.03), "30 mFLOPS");
  EXPECT_EQ(flops_to_string(9.1e9), "9.1 GFLOPS");
  EXPECT_EQ(flops_to_string(0), "0 FLOPS");
}

namespace {
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    a = register_module("a", torch::nn::Linear(4, 8));
    b = register_module("b", torch::nn::Linear(8, 2));
  }
  at::Tensor forward(const at::Tensor& x) { return b(a(x).relu()); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLayer);

void train(TwoLayer& model, const json& cfg, int steps, const std::filesystem::path& watch = {}) {
  auto engine = dscpp::initialize(model, cfg);
  for (int s = 0; s < steps; ++s) {
    for (int m = 0; m < engine.gradient_accumulation_steps(); ++m) {
      at::Tensor loss =
          engine
              .forward(at::randn({2, 4}, at::TensorOptions(engine.device()).dtype(engine.dtype())))
              .square()
              .mean();
      engine.backward(loss);
      engine.step();
    }
    // The report is written once: removed after its step, it does not come back.
    if (!watch.empty() && engine.global_steps() == 2) std::filesystem::remove(watch);
  }
}
}  // namespace

TEST(FlopsProfiler, EngineWritesDeepSpeedsReportAtProfileStep) {
  const auto dir = std::filesystem::temp_directory_path() / "dscpp_flops_engine";
  std::filesystem::remove_all(dir);
  const auto file = dir / "sub" / "profile.txt";  // its folder is made
  json cfg = {
      {"train_micro_batch_size_per_gpu", 2},
      {"gradient_accumulation_steps", 2},
      {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
      {"flops_profiler", {{"enabled", true}, {"profile_step", 1}, {"output_file", file.string()}}}};
  torch::manual_seed(0);
  TwoLayer model;
  train(model, cfg, 2);
  ASSERT_TRUE(std::filesystem::exists(file));
  const std::string r = read(file);
  // Profiled at global step 1 (the second optimizer step), titled with the count after it.
  EXPECT_NE(r.find("Profile Summary at step 2:\n"), std::string::npos) << r;
  // One micro-batch of 2: a [2,4]x[4,8] and a [2,8]x[8,2] product.
  EXPECT_NE(r.find(row("fwd MACs per GPU: ", "96 MACs")), std::string::npos) << r;
  EXPECT_NE(r.find(row("batch size per GPU: ", "2")), std::string::npos);
  EXPECT_NE(r.find(row("world size: ", "1")), std::string::npos);
  EXPECT_NE(r.find("bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: "), std::string::npos);
  EXPECT_NE(r.find("samples/second: "), std::string::npos);
  EXPECT_NE(r.find("Detailed Profile per GPU"), std::string::npos);  // detailed: true by default
  EXPECT_NE(r.find("  (a): Linear(40 = "), std::string::npos) << r;
  // Written once: removed after step 2, not written again at step 3.
  torch::manual_seed(0);
  TwoLayer again;
  train(again, cfg, 3, file);
  EXPECT_FALSE(std::filesystem::exists(file));
  std::filesystem::remove_all(dir);
}

TEST(FlopsProfiler, EngineHonoursDepthTopModulesDetailedAndRecomputeFactor) {
  const auto file = std::filesystem::temp_directory_path() / "dscpp_flops_options.txt";
  std::filesystem::remove(file);
  json cfg = {{"train_micro_batch_size_per_gpu", 2},
              {"optimizer", {{"type", "SGD"}, {"params", {{"lr", 0.1}}}}},
              {"flops_profiler",
               {{"enabled", true},
                {"profile_step", 0},
                {"module_depth", 1},
                {"top_modules", 2},
                {"detailed", false},
                {"recompute_fwd_factor", 1.0},
                {"output_file", file.string()}}}};
  torch::manual_seed(0);
  TwoLayer model;
  train(model, cfg, 1);
  const std::string r = read(file);
  EXPECT_NE(r.find("Profile Summary at step 1:\n"), std::string::npos) << r;
  EXPECT_NE(r.find("Top 2 modules in terms of params"), std::string::npos) << r;
  EXPECT_NE(r.find("depth 0:\n"), std::string::npos);
  EXPECT_EQ(r.find("depth 1:\n"), std::string::npos);  // module_depth 1: depth 0 only
  EXPECT_EQ(r.find("Detailed Profile per GPU"), std::string::npos);
  EXPECT_NE(r.find("bwd FLOPS per GPU = 3 * fwd flops per GPU / bwd latency: "), std::string::npos);
  EXPECT_NE(r.find("FLOPS per GPU = 4 * fwd flops per GPU / iter latency: "), std::string::npos);
  std::filesystem::remove(file);
}
