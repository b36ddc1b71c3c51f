// The public surface a ported DeepSpeed program uses, in one process: load_checkpoint in
// DeepSpeed's argument order and its load_module_strict, the accessors that replace core(),
// initialize over a std::shared_ptr module, a module forward that throws, and
// gathered_parameters (only the named parameters' buckets; the modifier's change reaching
// the fp32 master copy). Several ranks: engine_api_ranks.cpp.
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <unistd.h>

#include <filesystem>
#include <functional>
#include <memory>
#include <stdexcept>
#include <type_traits>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include "dscpp/dscpp.h"
#include "dscpp/nn/layer_module.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/torch_file.h"
#include "dscpp/runtime/precision/loss_scaler.h"
#include "dscpp/zero/gathered_parameters.h"
#include "dscpp/zero/zero_optimizer.h"

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

// Two linears; the second is registered as `head` (its name decides which checkpoint keys
// it matches). fail_next makes the next forward throw after its first layer ran.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(const std::string& head_name = "head") {
    a = register_module("a", torch::nn::Linear(4, 8));
    head = register_module(head_name, torch::nn::Linear(8, 2));
  }
  at::Tensor forward(at::Tensor x) {
    at::Tensor h = a(x).tanh();
    if (fail_next) {
      fail_next = false;
      throw std::runtime_error("forward failed on purpose");
    }
    return head(h);
  }
  torch::nn::Linear a{nullptr}, head{nullptr};
  bool fail_next = false;
};
TORCH_MODULE(Net);

json config(int stage, double lr = 0.1) {
  json zero = {{"stage", stage}, {"reduce_bucket_size", 1}};       // a bucket per parameter
  if (stage == 3) zero["stage3_param_persistence_threshold"] = 0;  // none kept whole
  return {{"train_batch_size", 4},
          {"train_micro_batch_size_per_gpu", 2},  // two micro-steps per step
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", lr}, {"weight_decay", 0.0}}}}},
          {"zero_optimization", zero}};
}

at::Tensor batch(int i) {
  return at::sin(at::arange(8, at::kFloat).reshape({2, 4}) * 0.3 + i * 0.7);
}

// Every parameter, whole (stage 3 gathers them for the copy), on the CPU in fp32.
template <typename E>
at::Tensor weights(E& engine, torch::nn::Module& m) {
  auto all = engine.gathered_parameters(m.parameters());
  std::vector<at::Tensor> flat;
  for (const auto& p : m.parameters())
    flat.push_back(p.detach().flatten().to(at::kCPU, at::kFloat));
  return at::cat(flat);
}

template <typename E>
void train(E& engine, int steps, int first = 0) {
  for (int s = first; s < first + steps; ++s)
    for (int m = 0; m < 2; ++m) {
      at::Tensor x = batch(2 * s + m).to(engine.device(), engine.dtype());
      engine.backward(engine.forward(x).to(at::kFloat).square().mean());
      engine.step();
    }
}

class EngineApi : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dscpp_api_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  fs::path dir_;
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dscpp::Error& e) {
    return e.what();
  }
  return "(no dscpp::Error)";
}

}  // namespace

// load_checkpoint(dir, tag, load_module_strict, load_optimizer_states, ...): a ported
// `load_checkpoint(d, t, true, false)` keeps a fresh optimizer, as in DeepSpeed.
TEST_F(EngineApi, LoadCheckpointTakesDeepSpeedsArgumentOrder) {
  torch::manual_seed(0);
  Net a;
  auto ea = dscpp::initialize(a, config(1));
  train(ea, 2);
  ea.save_checkpoint(dir());
  torch::manual_seed(1);
  Net b;
  auto eb = dscpp::initialize(b, config(1));
  eb.load_checkpoint(dir(), "", /*load_module_strict=*/true, /*load_optimizer_states=*/false);
  EXPECT_EQ(eb.core().zero_optimizer().step_count(), 0);  // fresh optimizer
  EXPECT_EQ(eb.global_steps(), 2);                        // the rest was loaded
  EXPECT_TRUE(at::equal(weights(ea, *a), weights(eb, *b)));
}

// A checkpoint with an extra key (old_head.*) and without one of the model's (head.*):
// refused by default naming both, loaded with load_module_strict=false: `a` from the
// checkpoint, `head` untouched, the fp32 master copy following the module.
TEST_F(EngineApi, NonStrictLoadToleratesMissingAndUnexpectedKeys) {
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    fs::remove_all(dir_);
    torch::manual_seed(0);
    Net old_model("old_head");
    auto eo = dscpp::initialize(old_model, config(stage));
    train(eo, 2);
    eo.save_checkpoint(dir());

    torch::manual_seed(1);
    Net m;
    auto e = dscpp::initialize(m, config(stage));
    const at::Tensor head_before = m->head->weight.detach().clone();
    const std::string strict = error_of([&] { e.load_checkpoint(dir()); });
    EXPECT_NE(strict.find("missing head.weight, head.bias"), std::string::npos) << strict;
    EXPECT_NE(strict.find("unexpected old_head.weight, old_head.bias"), std::string::npos)
        << strict;
    // Its optimizer state belongs to other parameters: refused unless it is left out.
    const std::string optim =
        error_of([&] { e.load_checkpoint(dir(), "", /*load_module_strict=*/false); });
    EXPECT_NE(optim.find("load_optimizer_states=false"), std::string::npos) << optim;

    auto r = e.load_checkpoint(dir(), "", /*load_module_strict=*/false,
                               /*load_optimizer_states=*/false);
    EXPECT_EQ(r.missing_keys, (std::vector<std::string>{"head.weight", "head.bias"}));
    EXPECT_EQ(r.unexpected_keys, (std::vector<std::string>{"old_head.weight", "old_head.bias"}));
    EXPECT_TRUE(at::equal(m->a->weight, old_model->a->weight));
    EXPECT_TRUE(at::equal(m->a->bias, old_model->a->bias));
    EXPECT_TRUE(at::equal(m->head->weight, head_before));
    EXPECT_EQ(e.global_steps(), 2);
    auto& zo = e.core().zero_optimizer();
    EXPECT_TRUE(at::equal(zo.master_partition(), zo.flat_params().to(at::kFloat)));
  }
}

TEST_F(EngineApi, NonStrictLoadAtStage3RefusesOtherParameters) {
  torch::manual_seed(0);
  Net old_model("old_head");
  auto eo = dscpp::initialize(old_model, config(3));
  train(eo, 1);
  eo.save_checkpoint(dir());
  Net m;
  auto e = dscpp::initialize(m, config(3));
  const std::string err = error_of([&] { e.load_checkpoint(dir(), "", false, false); });
  EXPECT_NE(err.find("at ZeRO stage 3"), std::string::npos) << err;
  EXPECT_NE(err.find("missing head.weight"), std::string::npos) << err;
}

TEST(EngineApiAccessors, ConfigDtypeAndGroupWithoutCore) {
  json cfg = config(1);
  cfg["bf16"] = {{"enabled", true}};
  Net m;
  auto e = dscpp::initialize(m, cfg);
  EXPECT_EQ(e.config().train_batch_size, 4);
  EXPECT_EQ(e.config().gradient_accumulation_steps, 2);
  EXPECT_EQ(e.dtype(), at::kBFloat16);
  EXPECT_EQ(m->a->weight.scalar_type(), at::kBFloat16);
  EXPECT_EQ(e.data_parallel_group().size(), 1);
}

// initialize over a std::shared_ptr of a module: Engine<std::shared_ptr<M>>, forward through
// module->forward, training exactly as over the holder.
TEST(EngineApiShared, SharedPtrModuleTrainsLikeItsHolder) {
  torch::manual_seed(0);
  Net held;
  auto eh = dscpp::initialize(held, config(2));
  train(eh, 3);
  torch::manual_seed(0);
  auto shared = std::make_shared<NetImpl>();
  auto es = dscpp::initialize(shared, config(2));
  static_assert(std::is_same_v<decltype(es), dscpp::Engine<std::shared_ptr<NetImpl>>>);
  train(es, 3);
  EXPECT_TRUE(at::equal(weights(eh, *held), weights(es, *shared)));
  EXPECT_EQ(es.module().get(), shared.get());
}

// A forward that throws (between two micro-steps): the engine goes on exactly as a run that
// never made the call, and at stage 3 nothing it gathered stays gathered.
TEST(EngineApiForward, ThrowingForwardLeavesNoTrace) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    auto run = [&](bool with_failure) {
      torch::manual_seed(0);
      Net m;
      auto e = dscpp::initialize(m, config(stage));
      auto& zo = e.core().zero_optimizer();
      train(e, 1);
      e.backward(e.forward(batch(10).to(e.device())).square().mean());  // micro-step 1 of 2
      if (with_failure) {
        const int64_t live = zo.live_numel();
        m->fail_next = true;
        EXPECT_THROW(e.forward(batch(11).to(e.device())), std::runtime_error);
        EXPECT_EQ(zo.live_numel(), live);
        for (size_t b = 0; b < zo.layout().buckets.size(); ++b)
          EXPECT_EQ(zo.bucket_state(static_cast<int>(b)),
                    stage == 3 ? dscpp::zero::ZeroOptimizer::BucketState::kRest
                               : dscpp::zero::ZeroOptimizer::BucketState::kGathered);
      }
      e.step();
      train(e, 2, 6);
      return weights(e, *m);
    };
    EXPECT_TRUE(at::equal(run(true), run(false)));
  }
}

// The same at stage 3 layer by layer: the middle layer throws after the first was gathered
// (and kept for its backward).
TEST(EngineApiForward, ThrowingLayerLeavesNoTraceAtStage3ByLayer) {
  auto fail = std::make_shared<bool>(false);
  auto linear = [](const std::string& name, int in, int out) {
    dscpp::nn::LayerSpec s;
    s.name = name;
    s.build = [in, out] { return torch::nn::Linear(in, out).ptr(); };
    s.forward = [](torch::nn::Module& m, const at::Tensor& x) {
      return static_cast<torch::nn::LinearImpl&>(m).forward(x).tanh();
    };
    return s;
  };
  auto specs = [&] {
    auto mid = linear("mid", 8, 8);
    mid.forward = [fail](torch::nn::Module& m, const at::Tensor& x) {
      if (*fail) {
        *fail = false;
        throw std::runtime_error("layer failed on purpose");
      }
      return static_cast<torch::nn::LinearImpl&>(m).forward(x);
    };
    return std::vector<dscpp::nn::LayerSpec>{linear("first", 4, 8), mid, linear("last", 8, 2)};
  };
  auto run = [&](bool with_failure) {
    torch::manual_seed(0);
    dscpp::nn::LayerModule m(specs());
    auto e = dscpp::initialize(m, config(3));
    auto& zo = e.core().zero_optimizer();
    train(e, 1);
    if (with_failure) {
      *fail = true;
      EXPECT_THROW(e.forward(batch(11).to(e.device())), std::runtime_error);
      EXPECT_EQ(zo.live_numel(), 0);
    }
    train(e, 2, 1);
    return weights(e, *m);
  };
  EXPECT_TRUE(at::equal(run(true), run(false)));
}

// Stage 3: only the buckets of the named parameters are gathered, and go back to rest; a
// modifier's change reaches the 16-bit partition and the fp32 master (an lr 0 step
// publishes the master: a stale one would undo the change).
TEST(EngineApiGathered, Stage3GathersOnlyTheNamedParameters) {
  Net m;
  auto e = dscpp::initialize(m, config(3, /*lr=*/0.0));
  auto& zo = e.core().zero_optimizer();
  ASSERT_EQ(zo.layout().buckets.size(), 4u);  // a bucket per parameter
  const int64_t before = zo.gathers();
  {
    auto g = e.gathered_parameters({m->head->weight}, /*modifier_rank=*/0);
    EXPECT_EQ(zo.gathers(), before + 1);
    EXPECT_EQ(g.scopes().at(0)->gathered_buckets().size(), 1u);
    EXPECT_EQ(m->head->weight.sizes(), (std::vector<int64_t>{2, 8}));
    EXPECT_EQ(m->a->weight.numel(), 0);  // not named: still at rest
    at::NoGradGuard no_grad;
    m->head->weight.fill_(0.5);
  }
  for (size_t b = 0; b < 4; ++b)
    EXPECT_EQ(zo.bucket_state(static_cast<int>(b)), dscpp::zero::ZeroOptimizer::BucketState::kRest);
  train(e, 1);
  auto g = e.gathered_parameters({m->head->weight});
  EXPECT_TRUE(at::all(m->head->weight == 0.5).item<bool>());
}

// Stages 0-2 in bf16: the named parameter's master elements follow the change; the others
// keep their fp32 values (a whole refresh would round them to bf16).
TEST(EngineApiGathered, ModifierUpdatesOnlyTheNamedMasterElements) {
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    json cfg = config(stage, 0.01);
    cfg["bf16"] = {{"enabled", true}};
    torch::manual_seed(0);
    Net m;
    auto e = dscpp::initialize(m, cfg);
    train(e, 2);
    auto& zo = e.core().zero_optimizer();
    const at::Tensor master_before = zo.master_partition().clone();
    {
      auto g = e.gathered_parameters({m->head->weight}, /*modifier_rank=*/0);
      at::NoGradGuard no_grad;
      m->head->weight.fill_(0.5);
    }
    const auto& lp = zo.layout().params[2];  // registration order: a.weight, a.bias, head.weight
    ASSERT_EQ(lp.numel, 16);
    at::Tensor master = zo.master_partition();
    at::Tensor changed = at::zeros({master.numel()}, master.options().dtype(at::kBool));
    changed.slice(0, lp.offset, lp.offset + lp.numel).fill_(true);
    EXPECT_TRUE(at::all(master.masked_select(changed) == 0.5).item<bool>());
    EXPECT_TRUE(at::equal(master.masked_select(~changed), master_before.masked_select(~changed)));
    EXPECT_FALSE(at::equal(master, master.to(at::kBFloat16).to(at::kFloat)));  // still fp32
  }
}

TEST(EngineApiGathered, ModifierRankOutsideTheGroupIsAnError) {
  Net m;
  auto e = dscpp::initialize(m, config(3));
  const std::string err = error_of([&] { e.gathered_parameters({m->a->weight}, 1); });
  EXPECT_NE(err.find("modifier_rank 1 is not a rank"), std::string::npos) << err;
}

// One type catches every error the library throws.
TEST(EngineApiErrors, EveryLibraryErrorDerivesFromDscppError) {
  static_assert(std::is_base_of_v<dscpp::Error, dscpp::ConfigError>);
  static_assert(std::is_base_of_v<dscpp::Error, dscpp::comm::CommError>);
  static_assert(std::is_base_of_v<dscpp::Error, dscpp::checkpoint::CheckpointError>);
  static_assert(std::is_base_of_v<dscpp::Error, dscpp::LossScaleAtMinimumError>);
  Net m;
  EXPECT_THROW(dscpp::initialize(m, json{{"train_batch_size", 4}}), dscpp::Error);  // no optimizer
  dscpp::InitArgs args;
  args.param_groups.push_back({{"no.such.parameter"}, json::object()});
  EXPECT_THROW(dscpp::initialize(m, config(0), args), dscpp::Error);
}

// "type": "Muon": which parameters each half takes (DeepSpeed's rule, the user's override), a
// checkpoint of the run loaded by a fresh engine, and what is refused by name: offload, a
// non-matrix given to Muon, an unknown name.
TEST(EngineApiMuon, HalvesOverridesAndRefusals) {
  auto muon_config = [](int stage) {
    json c = config(stage);
    c["optimizer"] = {{"type", "Muon"}, {"params", {{"lr", 0.02}, {"ns_method", "standard"}}}};
    return c;
  };
  auto error_of = [](const std::function<void()>& f) -> std::string {
    try {
      f();
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  {
    // a.weight and head.weight are matrices: Muon's; the biases: Adam's. The engine trains.
    Net m;
    auto engine = dscpp::initialize(m, muon_config(1));
    const at::Tensor before = m->a->weight.detach().clone();
    const at::Tensor bias_before = m->a->bias.detach().clone();
    for (int i = 0; i < 2; ++i) {
      at::Tensor loss = engine.forward(at::ones({2, 4})).square().mean();
      engine.backward(loss);
      engine.step();
    }
    EXPECT_FALSE(at::equal(m->a->weight, before));
    EXPECT_FALSE(at::equal(m->a->bias, bias_before));
    // The engine's buffers count Muon's partition too: one rank holds both matrices' fp32
    // master and momentum.
    const int64_t matrices = m->a->weight.numel() + m->head->weight.numel();
    const auto buffers = engine.core().memory_breakdown();
    EXPECT_EQ(dscpp::zero::bytes_named(buffers, "optimizer.momentum_buffer"), 4 * matrices);
    EXPECT_GE(dscpp::zero::bytes_named(buffers, "fp32_master"),
              4 * (matrices + m->a->bias.numel()));
    engine.save_checkpoint(testing::TempDir() + "muon_ck");
    Net fresh;
    auto loaded = dscpp::initialize(fresh, muon_config(1));
    (void)loaded.load_checkpoint(testing::TempDir() + "muon_ck");
    EXPECT_TRUE(at::equal(fresh->a->weight, m->a->weight));
    EXPECT_TRUE(at::equal(fresh->a->bias, m->a->bias));
  }
  {
    // Stage 3 keeps Muon's matrices in their own partition: the engine's gathering scope and
    // save_16bit_model reach them too (before, the module's empty tensors were read).
    Net m;
    json c = muon_config(3);
    c["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = true;
    auto engine = dscpp::initialize(m, c);
    at::Tensor loss = engine.forward(at::ones({2, 4})).square().mean();
    engine.backward(loss);
    engine.step();
    EXPECT_EQ(m->a->weight.numel(), 0);  // (at rest: partitioned)
    at::Tensor gathered;
    {
      auto scope = engine.gathered_parameters({m->a->weight, m->a->bias});
      gathered = m->a->weight.detach().clone();
    }
    EXPECT_EQ(gathered.sizes(), (std::vector<int64_t>{8, 4}));
    const std::string dir = testing::TempDir() + "muon_16bit";
    ASSERT_TRUE(engine.save_16bit_model(dir));
    const auto sd = dscpp::checkpoint::load_torch_file(dir + "/pytorch_model.bin");
    const at::Tensor saved = sd.find(dscpp::checkpoint::PyValue("a.weight"))->as_tensor();
    EXPECT_TRUE(at::equal(saved.to(gathered.scalar_type()), gathered));
  }
  Net m;
  dscpp::InitArgs bias;
  bias.use_muon["a.bias"] = true;
  EXPECT_NE(error_of([&] { dscpp::initialize(m, muon_config(1), bias); }).find("not a matrix"),
            std::string::npos);
  dscpp::InitArgs unknown;
  unknown.use_muon["no.such"] = false;
  EXPECT_NE(error_of([&] { dscpp::initialize(m, muon_config(1), unknown); }).find("no.such"),
            std::string::npos);
  // ZeRO-Offload to the CPU takes Muon (each matrix whole on the host); a partial offload,
  // which steps the partition a piece at a time, is refused naming the way out.
  json offload = muon_config(3);
  offload["zero_optimization"]["offload_optimizer"] = {{"device", "cpu"}};
  EXPECT_EQ(error_of([&] { dscpp::initialize(m, offload); }), "");
  offload["zero_optimization"]["offload_optimizer"]["ratio"] = 0.5;
  Net unreleased;  // (m's parameters stayed released by the stage-3 engine above)
  const std::string e = error_of([&] { dscpp::initialize(unreleased, offload); });
  EXPECT_NE(e.find("muon"), std::string::npos) << e;
  EXPECT_NE(e.find("ratio 1"), std::string::npos) << e;
}

// Stage 3 leaves the module's tensors empty: a second engine on that module, while the first
// lives or after it is gone, is refused naming the parameter, not left to fail in forward.
TEST(EngineApiStage3, AModuleEmptiedByStage3IsRefused) {
  Net m;
  auto error_of = [&m]() -> std::string {
    try {
      dscpp::initialize(m, config(3));
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  };
  {
    auto engine = dscpp::initialize(m, config(3));
    at::Tensor loss = engine.forward(at::ones({2, 4})).square().mean();
    engine.backward(loss);
    engine.step();
    EXPECT_NE(error_of().find("'a.weight' has no elements"), std::string::npos);
  }
  EXPECT_NE(error_of().find("'a.weight' has no elements"), std::string::npos);
  Net fresh;
  EXPECT_NO_THROW(dscpp::initialize(fresh, config(3)));
}
