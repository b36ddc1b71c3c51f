// GPT from model_zoo: config reading and its errors, the shipped configs, parameter counts,
// initialisation statistics, the LayerSpec form against the module, and training through
// dscpp::initialize (activation checkpointing: test_activation_checkpointing.cpp).

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/rand.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <map>
#include <set>

#include "dscpp/dscpp.h"
#include "dscpp/model_zoo/gpt.h"
#include "dscpp/model_zoo/gpt_tensor_parallel.h"
#include "dscpp/nn/activation_checkpointing.h"
#include "dscpp/nn/layer_module.h"
#include "dscpp/nn/rng_tracker.h"
#include "tests/cpu_bytes_counter.h"
#include "tests/gpu_skip.h"
#include "tests/model_zoo/gpt_test_util.h"

using dscpp::ConfigError;
using nlohmann::json;
namespace mz = dscpp::model_zoo;
namespace ac = dscpp::activation_checkpointing;

using namespace gpt_test;

// ---- configuration ---------------------------------------------------------------------------

TEST(GPTConfig, ReadsPractitionerKeysWithDefaults) {
  mz::GPTConfig c = mz::GPTConfig::from_json({{"hidden_size", 64},
                                              {"num_layers", 2},
                                              {"num_attention_heads", 8},
                                              {"seq_length", 32},
                                              {"vocab_size", 100}});
  EXPECT_EQ(c.ffn_hidden_size, 256);
  EXPECT_EQ(c.max_position_embeddings, 32);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.hidden_dropout, 0.1);
  EXPECT_DOUBLE_EQ(c.attention_dropout, 0.1);
  EXPECT_DOUBLE_EQ(c.layernorm_epsilon, 1e-5);
  EXPECT_DOUBLE_EQ(c.init_method_std, 0.02);
  EXPECT_EQ(c.gelu_approximation, "tanh");
  EXPECT_FALSE(c.checkpoint_activations);
  // max_position_embeddings alone gives the sequence length; both may differ.
  json j = c.to_json();
  j.erase("seq_length");
  j["max_position_embeddings"] = 48;
  j["layer_norm_epsilon"] = 1e-6;
  j.erase("layernorm_epsilon");
  mz::GPTConfig d = mz::GPTConfig::from_json(j);
  EXPECT_EQ(d.seq_length, 48);
  EXPECT_DOUBLE_EQ(d.layernorm_epsilon, 1e-6);
  j["seq_length"] = 40;
  EXPECT_EQ(mz::GPTConfig::from_json(j).positions(), 48);
  EXPECT_EQ(mz::GPTConfig::from_json(c.to_json()).to_json(), c.to_json());
}

TEST(GPTConfig, ErrorsNameTheKeyAndWhatWasExpected) {
  auto error_with = [](const std::function<void(json&)>& edit) {
    json j = small_json();
    edit(j);
    return config_error([&] { mz::GPTConfig::from_json(j); });
  };
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  std::string e = error_with([](json& j) { j.erase("hidden_size"); });
  EXPECT_TRUE(has(e, "hidden_size") && has(e, "required")) << e;
  e = error_with([](json& j) { j["num_layers"] = "deep"; });
  EXPECT_TRUE(has(e, "num_layers") && has(e, "expected an integer")) << e;
  e = error_with([](json& j) { j["num_attention_heads"] = 5; });
  EXPECT_TRUE(has(e, "num_attention_heads") && has(e, "divisor of hidden_size (32)")) << e;
  e = error_with([](json& j) { j["max_position_embeddings"] = 8; });
  EXPECT_TRUE(has(e, "max_position_embeddings") && has(e, "at least seq_length")) << e;
  e = error_with([](json& j) { j["hidden_dropout"] = 1.5; });
  EXPECT_TRUE(has(e, "hidden_dropout")) << e;
  e = error_with([](json& j) { j["gelu_approximation"] = "exact"; });
  EXPECT_TRUE(has(e, "gelu_approximation") && has(e, "\"tanh\", \"none\"")) << e;
  e = error_with([](json& j) { j["num_layer"] = 4; });
  EXPECT_TRUE(has(e, "num_layer") && has(e, "did you mean 'num_layers'")) << e;
  e = error_with([](json& j) {
    j["layernorm_epsilon"] = 1e-5;
    j["layer_norm_eps"] = 1e-6;
  });
  EXPECT_TRUE(has(e, "layer_norm_eps") && has(e, "only one")) << e;
  e = error_with([](json& j) { j.erase("seq_length"); });
  EXPECT_TRUE(has(e, "seq_length") && has(e, "max_position_embeddings")) << e;

  // Unknown keys: warnings instead of errors when asked.
  json extra = small_json();
  extra["model_type"] = "gpt2";
  mz::GPTConfig lenient = mz::GPTConfig::from_json(extra, /*strict=*/false);
  ASSERT_EQ(lenient.warnings.size(), 1u);
  EXPECT_TRUE(has(lenient.warnings[0], "model_type"));

  // A file's errors name the file.
  std::string path = ::testing::TempDir() + "bad_gpt.json";
  std::ofstream(path) << "{\"hidden_size\": 32, \"num_layers\": 0}";
  e = config_error([&] { mz::GPTConfig::from_file(path); });
  EXPECT_TRUE(has(e, "num_layers") && has(e, path)) << e;
}

TEST(GPTConfig, ParallelismDegreesAndTheWorldSizeArithmetic) {
  auto has = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };
  json j = small_json();
  EXPECT_FALSE(mz::GPTConfig::from_json(j).parallelism.any_model_parallelism());
  j["parallelism"] = {{"tensor_model_parallel_size", 2}, {"pipeline_model_parallel_size", 2}};
  mz::GPTConfig c = mz::GPTConfig::from_json(j);
  EXPECT_EQ(c.parallelism.resolve(8).data_parallel_size, 2);  // what remains of the world
  EXPECT_EQ(mz::GPTConfig::from_json(c.to_json()).parallelism.to_json(), c.parallelism.to_json());
  std::string e = config_error([&] { c.parallelism.resolve(6); });
  EXPECT_TRUE(has(e, "2 x pipeline_model_parallel_size 2 = 4 does not divide the world size 6"))
      << e;
  j["parallelism"]["data_parallel_size"] = 4;
  c = mz::GPTConfig::from_json(j);
  e = config_error([&] { c.parallelism.resolve(8); });
  EXPECT_TRUE(has(e, "data_parallel_size 4 = 16, but the job has 8 ranks")) << e;
  EXPECT_EQ(c.parallelism.resolve(16).data_parallel_size, 4);
  j["parallelism"] = {{"tensor_model_paralel_size", 2}};
  e = config_error([&] { mz::GPTConfig::from_json(j); });
  EXPECT_TRUE(has(e, "parallelism.tensor_model_paralel_size")) << e;
  j["parallelism"] = {{"sequence_parallel", true}};
  e = config_error([&] { mz::GPTConfig::from_json(j); });
  EXPECT_TRUE(has(e, "parallelism.sequence_parallel") && has(e, "tensor_model_parallel_size > 1"))
      << e;
  j["parallelism"] = {{"tensor_model_parallel_size", 2}};
  EXPECT_TRUE(mz::GPTConfig::from_json(j).parallelism.async_tensor_model_parallel_allreduce);
  j["parallelism"]["async_tensor_model_parallel_allreduce"] = false;
  c = mz::GPTConfig::from_json(j);
  EXPECT_FALSE(c.parallelism.async_tensor_model_parallel_allreduce);
  EXPECT_EQ(c.parallelism.to_json()["async_tensor_model_parallel_allreduce"], false);
  EXPECT_FALSE(mz::ParallelismConfig::from_json(mz::ParallelismConfig().to_json(), "parallelism")
                   .to_json()
                   .contains("async_tensor_model_parallel_allreduce"));
  // tp_comm_overlap: off by default and then not written; on needs the async option.
  EXPECT_FALSE(c.parallelism.tp_comm_overlap);
  EXPECT_FALSE(c.parallelism.to_json().contains("tp_comm_overlap"));
  e = config_error([&] {
    auto k = j;
    k["parallelism"]["tp_comm_overlap"] = true;
    mz::GPTConfig::from_json(k);
  });
  EXPECT_TRUE(has(e, "parallelism.tp_comm_overlap") &&
              has(e, "async_tensor_model_parallel_allreduce true, found false"))
      << e;
  j["parallelism"] = {{"tensor_model_parallel_size", 2},
                      {"tp_comm_overlap", true},
                      {"tp_comm_overlap_num_splits", 3}};
  c = mz::GPTConfig::from_json(j);
  EXPECT_TRUE(c.parallelism.tp_comm_overlap);
  EXPECT_EQ(c.parallelism.tp_comm_overlap_num_splits, 3);
  EXPECT_EQ(mz::ParallelismConfig::from_json(c.parallelism.to_json(), "parallelism").to_json(),
            c.parallelism.to_json());
  j["parallelism"]["tp_comm_overlap_num_splits"] = 0;
  e = config_error([&] { mz::GPTConfig::from_json(j); });
  EXPECT_TRUE(has(e, "parallelism.tp_comm_overlap_num_splits")) << e;
  // The pipeline's schedule: "auto" and then not written; a name of the ds_config's
  // pipeline.schedule read back; anything else refused naming the key and the names.
  j["parallelism"] = {{"pipeline_model_parallel_size", 2}};
  EXPECT_EQ(mz::GPTConfig::from_json(j).parallelism.pipeline_parallel_schedule, "auto");
  EXPECT_FALSE(
      mz::GPTConfig::from_json(j).parallelism.to_json().contains("pipeline_parallel_schedule"));
  j["parallelism"]["pipeline_parallel_schedule"] = "ZB-H1";
  c = mz::GPTConfig::from_json(j);
  EXPECT_EQ(c.parallelism.pipeline_parallel_schedule, "zb-h1");
  EXPECT_EQ(mz::ParallelismConfig::from_json(c.parallelism.to_json(), "parallelism").to_json(),
            c.parallelism.to_json());
  j["parallelism"]["pipeline_parallel_schedule"] = "gpipe";
  e = config_error([&] { mz::GPTConfig::from_json(j); });
  EXPECT_TRUE(has(e, "parallelism.pipeline_parallel_schedule") && has(e, "\"zb-h1\"")) << e;
  j["parallelism"] = 2;
  e = config_error([&] { mz::GPTConfig::from_json(j); });
  EXPECT_TRUE(has(e, "parallelism") && has(e, "expected an object")) << e;
}

TEST(GPTConfig, ShippedConfigsHaveThePublishedShapes) {
  mz::GPTConfig tiny = mz::GPTConfig::from_file(shipped("gpt_tiny.json"));
  EXPECT_EQ(tiny.vocab_size, 50304);
  EXPECT_EQ(tiny.vocab_size % 128, 0);
  EXPECT_LE(tiny.num_parameters(), 10'000'000);

  mz::GPTConfig small = mz::GPTConfig::from_file(shipped("gpt_125M.json"));
  // GPT-2 small's 124,439,808 parameters with the vocabulary padded from 50257 to 50304.
  EXPECT_EQ(small.num_parameters(), 124'439'808 + 47 * 768);
  EXPECT_DOUBLE_EQ(small.flops_per_token(), 6.0 * small.num_parameters() + 12.0 * 12 * 768 * 1024);

  mz::GPTConfig xl = mz::GPTConfig::from_file(shipped("gpt_1.3B.json"));
  EXPECT_EQ(xl.hidden_size, 2048);
  EXPECT_EQ(xl.num_layers, 24);
  EXPECT_EQ(xl.num_attention_heads, 16);
  EXPECT_EQ(xl.seq_length, 1024);
  EXPECT_EQ(xl.vocab_size, 50304);
  EXPECT_NEAR(xl.num_parameters() / 1e9, 1.3, 0.05);

  mz::GPTConfig big = mz::GPTConfig::from_file(shipped("gpt_13B.json"));
  EXPECT_EQ(big.hidden_size, 5120);
  EXPECT_EQ(big.num_layers, 40);
  EXPECT_EQ(big.num_attention_heads, 40);
  EXPECT_EQ(big.seq_length, 2048);
  EXPECT_EQ(big.vocab_size, 50304);
  EXPECT_NEAR(big.num_parameters() / 1e9, 12.9, 0.15);
}

// ---- the module ------------------------------------------------------------------------------

TEST(GPT, NumParametersIsTheModulesCount) {
  for (bool tied : {true, false}) {
    mz::GPTConfig c = small_config(0.0, tied);
    c.ffn_hidden_size = 40;
    c.max_position_embeddings = 20;
    mz::GPT model(c);
    EXPECT_EQ(count_parameters(*model), c.num_parameters()) << "tied " << tied;
  }
  for (const char* file : {"gpt_tiny.json", "gpt_125M.json", "llama_tiny.json"}) {
    mz::GPTConfig c = mz::GPTConfig::from_file(shipped(file));
    mz::GPT model(c);
    EXPECT_EQ(count_parameters(*model), c.num_parameters()) << file;
  }
}

TEST(GPT, InitialisationIsGPT2AndMegatrons) {
  mz::GPTConfig c = mz::GPTConfig::from_json({{"hidden_size", 256},
                                              {"num_layers", 4},
                                              {"num_attention_heads", 4},
                                              {"seq_length", 64},
                                              {"vocab_size", 1000},
                                              {"tie_word_embeddings", false}});
  at::manual_seed(0);
  mz::GPT model(c);
  const double scaled = 0.02 / std::sqrt(2.0 * 4);
  int checked = 0;
  for (const auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    const at::Tensor& p = item.value();
    auto ends_with = [&](const std::string& tail) {
      return name.size() >= tail.size() &&
             name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
    };
    if (name.find("ln_") != std::string::npos || name.find("final_norm") != std::string::npos) {
      EXPECT_TRUE(at::equal(p, ends_with("weight") ? at::ones_like(p) : at::zeros_like(p))) << name;
    } else if (ends_with("bias")) {
      EXPECT_TRUE(at::equal(p, at::zeros_like(p))) << name;
    } else {
      const double expected = ends_with("proj.weight") ? scaled : 0.02;
      const double std = p.std().item<double>(), mean = p.mean().item<double>();
      // 16k to 256k samples: the estimates' own spread is well under 1%.
      EXPECT_NEAR(std / expected, 1.0, 0.03) << name;
      EXPECT_NEAR(mean / expected, 0.0, 0.03) << name;
    }
    ++checked;
  }
  EXPECT_EQ(checked, 2 + 4 * 12 + 2 + 1);
}

TEST(GPT, ForwardShapesLossAndTiedHead) {
  mz::GPTConfig c = small_config();
  mz::GPT model(c);
  Batch b = random_batch(c, 2, 9, 1);
  at::Tensor logits = model->forward(b.ids);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 9, c.vocab_size}));
  at::Tensor loss = model->loss(logits, b.targets);
  // Freshly initialised: close to the uniform prediction's log(V).
  EXPECT_NEAR(loss.item<double>(), std::log(static_cast<double>(c.vocab_size)), 0.3);
  EXPECT_FALSE(model->head);
  EXPECT_THROW(model->forward(at::zeros({2, c.seq_length + 1}, at::kLong)), c10::Error);
  EXPECT_THROW(model->forward(at::zeros({2, 3})), c10::Error);
  // Causal: the logits of position t do not depend on tokens after t.
  model->eval();
  at::Tensor changed = b.ids.clone();
  changed.select(1, 8).fill_(3);
  at::Tensor a = model->forward(b.ids), d = model->forward(changed);
  EXPECT_TRUE(at::equal(a.narrow(1, 0, 8), d.narrow(1, 0, 8)));
  EXPECT_FALSE(at::equal(a.narrow(1, 8, 1), d.narrow(1, 8, 1)));
}

TEST(GPT, LayerSpecsInSequenceGiveTheModulesOutput) {
  for (bool tied : {true, false}) {
    mz::GPTConfig c = small_config(0.1, tied);
    mz::GPT model(c);
    std::vector<dscpp::nn::LayerSpec> specs = mz::gpt_layer_specs(c);
    ASSERT_EQ(specs.size(), static_cast<size_t>(c.num_layers + 3));
    std::vector<dscpp::nn::Layer> layers = dscpp::nn::build_layers(specs);
    // Tied: the head runs the embedding's module itself.
    EXPECT_EQ(layers.front().module == layers.back().module, tied);

    // The same weights, by name: layer name + "." + the name inside the layer.
    std::map<std::string, at::Tensor> whole;
    for (const auto& item : model->named_parameters()) whole[item.key()] = item.value();
    std::set<std::string> covered;
    {
      at::NoGradGuard no_grad;
      for (const auto& layer : layers) {
        if (layer.name == "head" && tied) continue;  // the embedding's parameters
        for (const auto& item : layer.module->named_parameters()) {
          std::string key = layer.name + "." + item.key();
          ASSERT_TRUE(whole.count(key)) << key;
          item.value().copy_(whole[key]);
          covered.insert(key);
        }
      }
    }
    EXPECT_EQ(covered.size(), whole.size());

    Batch b = random_batch(c, 3, 11, 2);
    for (bool training : {false, true}) {
      model->train(training);
      for (auto& layer : layers) layer.module->train(training);
      at::manual_seed(5);
      at::Tensor expected = model->forward(b.ids);
      at::manual_seed(5);
      at::Tensor got = dscpp::nn::run_layers(layers, b.ids);
      EXPECT_TRUE(at::equal(expected, got)) << "tied " << tied << " training " << training;
    }
  }
}

// LayerModule: the layers as one module whose state dict is GPT's, key for key, and whose
// forward with no hooks is the layers in sequence; each layer names the parameters it uses.
TEST(GPT, LayerModuleHasTheModulesStateDictAndOutput) {
  for (bool tied : {true, false}) {
    mz::GPTConfig c = small_config(0.0, tied);
    mz::GPT model(c);
    dscpp::nn::LayerModule layered(mz::gpt_layer_specs(c));
    std::map<std::string, at::Tensor> whole;
    for (const auto& item : model->named_parameters()) whole[item.key()] = item.value();
    std::set<std::string> keys;
    {
      at::NoGradGuard no_grad;
      for (const auto& item : layered->named_parameters()) {
        ASSERT_TRUE(whole.count(item.key())) << item.key();
        ASSERT_EQ(item.value().sizes(), whole[item.key()].sizes()) << item.key();
        item.value().copy_(whole[item.key()]);
        keys.insert(item.key());
      }
    }
    EXPECT_EQ(keys.size(), whole.size());
    const auto uses = layered->layer_parameters();
    ASSERT_EQ(uses.size(), static_cast<size_t>(c.num_layers + 3));
    EXPECT_EQ(uses.front(),
              (std::vector<std::string>{"embedding.word.weight", "embedding.position.weight"}));
    EXPECT_EQ(uses.back(), tied ? std::vector<std::string>{"embedding.word.weight"}
                                : std::vector<std::string>{"head.weight"});
    EXPECT_EQ(uses[1].front(), "blocks.0.ln_1.weight");
    Batch b = random_batch(c, 2, 9, 3);
    EXPECT_TRUE(at::equal(model->forward(b.ids), layered->forward(b.ids))) << "tied " << tied;
  }
}

// The current models' blocks (llama_tiny.json's kinds, at small_json's size): the LayerSpec form
// builds the same modules, so it has GPT's state dict and output; the tensor-parallel GPT,
// which has GPT-2's blocks only, refuses each of them by its key.
TEST(GPT, LlamaStyleBlocksInTheLayerSpecFormAndRefusedByTensorParallel) {
  json j = small_json();
  j.update({{"normalization", "RMSNorm"},
            {"position_embedding_type", "rope"},
            {"swiglu", true},
            {"ffn_hidden_size", 48},
            {"num_query_groups", 2},
            {"add_bias_linear", false},
            {"untie_embeddings_and_output_weights", true}});
  mz::GPTConfig c = mz::GPTConfig::from_json(j);
  mz::GPT model(c);
  EXPECT_EQ(count_parameters(*model), c.num_parameters());
  dscpp::nn::LayerModule layered(mz::gpt_layer_specs(c));
  std::map<std::string, at::Tensor> whole;
  for (const auto& item : model->named_parameters()) whole[item.key()] = item.value();
  {
    at::NoGradGuard no_grad;
    for (const auto& item : layered->named_parameters()) {
      ASSERT_TRUE(whole.count(item.key())) << item.key();
      item.value().copy_(whole[item.key()]);
    }
  }
  EXPECT_EQ(layered->named_parameters().size(), whole.size());
  EXPECT_EQ(layered->layer_parameters().front(),
            (std::vector<std::string>{"embedding.word.weight"}));  // rope: no position table
  Batch b = random_batch(c, 2, 9, 3);
  EXPECT_TRUE(at::equal(model->forward(b.ids), layered->forward(b.ids)));

  const mz::GPTConfig gpt2 = small_config();
  const mz::GPTConfig llama = c;
  auto has = [](const std::string& m, const std::string& part) {
    return m.find(part) != std::string::npos;
  };
  auto error_of = [](const std::function<void()>& f) { return config_error(f); };
  json no_bias = small_json();

  // The tensor-parallel GPT has GPT-2's blocks only: the others are refused by their key.
  EXPECT_NO_THROW(mz::validate_tensor_parallel(gpt2, 1));
  EXPECT_TRUE(has(error_of([&] { mz::validate_tensor_parallel(llama, 1); }),
                  "normalization: expected GPT-2's block"));
  no_bias["add_bias_linear"] = false;
  EXPECT_TRUE(
      has(error_of([&] { mz::validate_tensor_parallel(mz::GPTConfig::from_json(no_bias), 1); }),
          "the tensor-parallel GPT does not implement add_bias_linear = false"));
}

// ---- activation checkpointing ----------------------------------------------------------------

TEST(GPT, TrainsThroughTheEngineWithCheckpointing) {
  mz::GPTConfig c = mz::GPTConfig::from_json({{"hidden_size", 32},
                                              {"num_layers", 2},
                                              {"num_attention_heads", 2},
                                              {"seq_length", 16},
                                              {"vocab_size", 64},
                                              {"hidden_dropout", 0.0},
                                              {"attention_dropout", 0.0}});
  at::manual_seed(0);
  mz::GPT model(c);
  json ds = {{"train_batch_size", 4},
             {"gradient_clipping", 1.0},
             {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-2}}}}},
             {"activation_checkpointing", {{"number_checkpoints", 1}}}};
  auto engine = dscpp::initialize(model, ds);
  model->enable_activation_checkpointing(engine.core().config().activation_checkpointing);
  EXPECT_EQ(model->activation_checkpointing_segments(), 1);
  // A periodic text: each token follows from the previous one.
  at::Tensor start = at::arange(4, at::kLong).unsqueeze(1) * 5;
  at::Tensor tokens = (start + at::arange(17, at::kLong) * 3) % c.vocab_size;
  at::Tensor ids = tokens.narrow(1, 0, 16).to(engine.device());
  at::Tensor targets = tokens.narrow(1, 1, 16).to(engine.device());
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    at::Tensor loss = model->loss(engine.forward(ids), targets);
    engine.backward(loss);
    engine.step();
    (step == 0 ? first : last) = loss.item<double>();
  }
  std::cout << "loss " << first << " -> " << last << "\n";
  EXPECT_LT(last, first / 4) << "first loss " << first << ", last " << last;
}

// gradient_accumulation_fusion: on by default, read when off, and kept out of to_json (a
// runtime path, not the model).
TEST(GPTConfig, GradientAccumulationFusionKey) {
  json j = small_json();
  EXPECT_TRUE(mz::GPTConfig::from_json(j).gradient_accumulation_fusion);
  j["gradient_accumulation_fusion"] = false;
  const mz::GPTConfig off = mz::GPTConfig::from_json(j);
  EXPECT_FALSE(off.gradient_accumulation_fusion);
  EXPECT_FALSE(off.to_json().contains("gradient_accumulation_fusion"));
}

// residual_layernorm_fusion (ops::add_layer_norm in each block) against the eager add and
// layer_norm: the same weights give the same loss and every parameter's gradient, in float64
// (so only the order of float64 roundings differs), with dropout off.
TEST(GPT, FusedResidualLayerNormEqualsEager) {
  json j = small_json();
  mz::GPTConfig eager_default = mz::GPTConfig::from_json(j);
  ASSERT_TRUE(eager_default.residual_layernorm_fusion);  // the default with LayerNorm
  j["residual_layernorm_fusion"] = true;
  mz::GPTConfig fused_cfg = mz::GPTConfig::from_json(j);
  j["residual_layernorm_fusion"] = false;
  mz::GPTConfig eager_cfg = mz::GPTConfig::from_json(j);
  EXPECT_FALSE(eager_cfg.residual_layernorm_fusion);
  mz::GPT fused(fused_cfg), eager(eager_cfg);
  fused->to(at::kDouble);
  eager->to(at::kDouble);
  {
    const at::NoGradGuard no_grad;
    auto src = fused->named_parameters(), dst = eager->named_parameters();
    for (const auto& p : src) dst[p.key()].copy_(p.value());
  }
  Batch b = random_batch(fused_cfg, 2, 9, 7);
  at::Tensor lf = fused->loss(fused->forward(b.ids), b.targets);
  at::Tensor le = eager->loss(eager->forward(b.ids), b.targets);
  EXPECT_NEAR(lf.item<double>(), le.item<double>(), 1e-12);
  lf.backward();
  le.backward();
  auto ge = eager->named_parameters();
  for (const auto& p : fused->named_parameters()) {
    SCOPED_TRACE(p.key());
    ASSERT_TRUE(p.value().grad().defined());
    EXPECT_TRUE(at::allclose(p.value().grad(), ge[p.key()].grad(), 1e-10, 1e-12));
  }
}
