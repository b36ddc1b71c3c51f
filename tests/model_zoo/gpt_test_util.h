// Helpers shared by the model_zoo GPT tests (test_model_zoo.cpp,
// test_activation_checkpointing.cpp): small configs, random batches, one training step, gradients
// by name, the CPU memory of a step.
#pragma once

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

using dscpp::ConfigError;
using nlohmann::json;
namespace mz = dscpp::model_zoo;
namespace ac = dscpp::activation_checkpointing;

namespace gpt_test {

inline json small_json() {
  return {{"hidden_size", 32},       {"num_layers", 3},  {"num_attention_heads", 4},
          {"seq_length", 16},        {"vocab_size", 61}, {"hidden_dropout", 0.0},
          {"attention_dropout", 0.0}};
}

inline mz::GPTConfig small_config(double dropout = 0.0, bool tied = true) {
  json j = small_json();
  j["hidden_dropout"] = dropout;
  j["attention_dropout"] = dropout;
  j["tie_word_embeddings"] = tied;
  return mz::GPTConfig::from_json(j);
}

inline std::string shipped(const std::string& name) {
  return std::string(DSCPP_MODEL_ZOO_CONFIGS) + "/" + name;
}

// The message of the ConfigError `f` throws ("" when it throws none).
template <typename F>
inline std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

inline int64_t count_parameters(torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

inline std::map<std::string, at::Tensor> grads_of(torch::nn::Module& m) {
  std::map<std::string, at::Tensor> out;
  for (const auto& item : m.named_parameters())
    out[item.key()] = item.value().grad().defined() ? item.value().grad().clone() : at::Tensor();
  return out;
}

inline void zero_grads(torch::nn::Module& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
}

struct Batch {
  at::Tensor ids, targets;
};

inline Batch random_batch(const mz::GPTConfig& c, int64_t batch, int64_t seq, uint64_t seed) {
  at::manual_seed(seed);
  return {at::randint(c.vocab_size, {batch, seq}, at::kLong),
          at::randint(c.vocab_size, {batch, seq}, at::kLong)};
}

// One forward and backward from RNG seed `seed`; the loss, and the state of the RNG after.
struct Step {
  at::Tensor loss, rng_after;
};
inline Step train_step(mz::GPT& model, const Batch& b, uint64_t seed) {
  zero_grads(*model);
  at::manual_seed(seed);
  at::Tensor loss = model->loss(model->forward(b.ids), b.targets);
  loss.backward();
  return {loss.detach(), at::rand({4})};
}

// Gradients of two computations that must be the same function of the same inputs (a
// recompute against the plain pass). Not bit for bit: a CPU matrix product's rounding may
// follow the thread count and the buffers' alignment, which a loaded machine and another
// allocation change (a 2e-6 difference in a bias gradient was seen under the full suite).
// 1e-5 of the tensor's largest element is far below what a real fault moves: a lost or
// doubled gradient changes it by 100%, another dropout mask in the recompute by percents.
inline void expect_grads_match(const std::map<std::string, at::Tensor>& a,
                               const std::map<std::string, at::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, g] : a) {
    ASSERT_TRUE(g.defined()) << name;
    const at::Tensor& h = b.at(name);
    ASSERT_TRUE(h.defined()) << name;
    ASSERT_EQ(g.sizes(), h.sizes()) << name;
    const double scale = h.abs().max().item<double>();
    const double diff = (g - h).abs().max().item<double>();
    EXPECT_LE(diff, 1e-5 * scale + 1e-12)
        << name << " differs: max |diff| " << diff << " against max |grad| " << scale;
  }
}

// Losses of the same kind of pair, to the same relative tolerance.
inline void expect_loss_match(const at::Tensor& a, const at::Tensor& b) {
  const double x = a.item<double>(), y = b.item<double>();
  EXPECT_LE(std::abs(x - y), 1e-6 * std::abs(y)) << x << " against " << y;
}

struct MemoryUse {
  int64_t after_forward = 0;  // bytes alive between forward and backward
  int64_t peak = 0;           // high-water mark over forward and backward
};

// Allocation counts from before the forward: parameters and the batch exist already and are
// not counted. The gradient buffers are new in both cases alike.
inline MemoryUse cpu_memory_of_step(mz::GPT& model, const Batch& b) {
  zero_grads(*model);
  auto counter = std::make_shared<dscpp::testing::CpuBytesCounter>();
  MemoryUse use;
  {
    c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, counter);
    at::manual_seed(7);
    at::Tensor loss = model->loss(model->forward(b.ids), b.targets);
    use.after_forward = counter->live.load();
    loss.backward();
  }
  use.peak = counter->peak.load();
  return use;
}

inline mz::GPTConfig memory_config() {
  // Deep and narrow, with attention dropout (its probabilities are kept): activations dwarf
  // the weights, as in real training.
  return mz::GPTConfig::from_json({{"hidden_size", 64},
                                   {"num_layers", 8},
                                   {"num_attention_heads", 4},
                                   {"seq_length", 128},
                                   {"vocab_size", 128},
                                   {"hidden_dropout", 0.1},
                                   {"attention_dropout", 0.1}});
}

}  // namespace gpt_test
