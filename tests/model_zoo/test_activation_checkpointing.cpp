// Activation checkpointing on model_zoo's GPT and on any function: gradients against plain
// ones (to rounding) (dropout on and off), the model-parallel RNG tracker restored on
// recompute, auxiliary losses carried through it (the MoE GPT's, its routing counted once),
// the refusals, and the peak memory it saves (CPU allocator events; CUDA caching
// allocator stats in the CUDA build).

#include "tests/model_zoo/gpt_test_util.h"

#include "dscpp/nn/aux_loss.h"
#include "dscpp/nn/moe/router.h"

using namespace gpt_test;

TEST(ActivationCheckpointing, GPTGradientsMatchThePlainPass) {
  for (double dropout : {0.0, 0.1}) {
    mz::GPTConfig c = small_config(dropout);
    at::manual_seed(3);
    mz::GPT model(c);
    Batch b = random_batch(c, 4, 16, 4);
    Step plain = train_step(model, b, 11);
    auto expected = grads_of(*model);

    dscpp::ActivationCheckpointingConfig one_each, two_segments, on_cpu;
    two_segments.number_checkpoints = 2;
    on_cpu.cpu_checkpointing = true;  // nothing to move for CPU tensors: the same result
    for (const auto* section : {&one_each, &two_segments, &on_cpu}) {
      model->enable_activation_checkpointing(*section);
      Step ckpt = train_step(model, b, 11);
      SCOPED_TRACE("dropout " + std::to_string(dropout) + ", segments " +
                   std::to_string(model->activation_checkpointing_segments()));
      expect_loss_match(ckpt.loss, plain.loss);
      // The RNG continues as it would have: the next batch sees the same stream.
      EXPECT_TRUE(at::equal(plain.rng_after, ckpt.rng_after));
      expect_grads_match(expected, grads_of(*model));
    }
    model->disable_activation_checkpointing();
    if (dropout > 0) {
      // Dropout was really on: another seed gives another loss.
      EXPECT_FALSE(at::equal(plain.loss, train_step(model, b, 12).loss));
    }
  }
}

// activation_checkpointing.profile, read from a ds_config: one line of wall time for each
// checkpoint's forward and one for its recompute+backward (DeepSpeed's timers), none without
// it; the gradients stay those of the plain run either way.
TEST(ActivationCheckpointing, ProfilePrintsEachCheckpointsTimes) {
  mz::GPTConfig c = small_config(0.0);
  at::manual_seed(3);
  mz::GPT model(c);
  Batch b = random_batch(c, 4, 16, 4);
  train_step(model, b, 11);
  auto expected = grads_of(*model);
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  for (bool profile : {true, false}) {
    const auto cfg = dscpp::parse_ds_config(
        {{"train_batch_size", 4},
         {"activation_checkpointing", {{"number_checkpoints", 2}, {"profile", profile}}}});
    model->enable_activation_checkpointing(cfg.activation_checkpointing);
    const int segments = static_cast<int>(model->activation_checkpointing_segments());
    ASSERT_GT(segments, 0);
    testing::internal::CaptureStderr();
    train_step(model, b, 11);
    const std::string err = testing::internal::GetCapturedStderr();
    const int expected_lines = profile ? segments : 0;
    EXPECT_EQ(count(err, "dscpp: activation checkpoint forward: "), expected_lines) << err;
    EXPECT_EQ(count(err, "dscpp: activation checkpoint recompute+backward: "), expected_lines)
        << err;
    expect_grads_match(expected, grads_of(*model));
  }
  model->disable_activation_checkpointing();
}

TEST(ActivationCheckpointing, AnyFunctionOfSeveralTensors) {
  at::manual_seed(0);
  at::Tensor w = at::randn({5, 5}).requires_grad_();
  at::Tensor x = at::randn({3, 5}).requires_grad_();
  at::Tensor y = at::randn({3, 5});  // needs no gradient
  auto fn = [w](const std::vector<at::Tensor>& in) {
    at::Tensor h = at::dropout(at::tanh(in[0].matmul(w)), 0.5, true) * in[1];
    return std::vector<at::Tensor>{h.sum(1), h.argmax(1), h * 2};
  };
  auto run = [&](bool checkpointed) {
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    at::manual_seed(9);
    auto out = checkpointed ? ac::checkpoint(fn, {x, y}) : fn({x, y});
    EXPECT_FALSE(out[1].requires_grad());  // integer output
    (out[0].sum() + out[2].pow(2).sum()).backward();
    return std::vector<at::Tensor>{out[0].detach(), w.grad().clone(), x.grad().clone()};
  };
  auto plain = run(false), ckpt = run(true);
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << i;
}

// Dropout in a tensor-parallel region draws under the model-parallel RNG tracker's fork: the
// recompute must draw the forward's mask from the tracker's stream too, and leave the tracker
// where the plain run leaves it.
TEST(ActivationCheckpointing, RecomputeRestoresTheModelParallelRngTracker) {
  at::manual_seed(0);
  at::Tensor w = at::randn({6, 6}).requires_grad_();
  at::Tensor x = at::randn({4, 6}).requires_grad_();
  auto fn = [w](const at::Tensor& in) {
    at::Tensor h = at::tanh(in.matmul(w));
    auto fork = dscpp::nn::get_cuda_rng_tracker().fork();
    return at::dropout(h, 0.5, true);
  };
  auto run = [&](bool checkpointed) {
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    dscpp::nn::model_parallel_cuda_manual_seed(5, 1);
    at::Tensor out = checkpointed ? ac::checkpoint(fn, x) : fn(x);
    // Between forward and backward the tracker's stream moves on (other layers draw).
    {
      auto fork = dscpp::nn::get_cuda_rng_tracker().fork();
      (void)at::rand({7});
    }
    (out.pow(2) * at::arange(6, at::kFloat)).sum().backward();
    auto fork = dscpp::nn::get_cuda_rng_tracker().fork();
    return std::vector<at::Tensor>{out.detach(), w.grad().clone(), x.grad().clone(), at::rand({3})};
  };
  auto plain = run(false), ckpt = run(true);
  const char* what[] = {"output", "w.grad", "x.grad", "the tracker's next draw"};
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << what[i];
}

TEST(ActivationCheckpointing, RefusesAutogradGradAndNamesWhatItIgnores) {
  at::Tensor x = at::randn({4}).requires_grad_();
  at::Tensor y = ac::checkpoint([](const at::Tensor& t) { return (t * t).sum(); }, x);
  EXPECT_THROW(torch::autograd::grad({y}, {x}), c10::Error);

  mz::GPT model(small_config());
  dscpp::ActivationCheckpointingConfig section;
  section.partition_activations = true;
  section.contiguous_memory_optimization = true;
  std::vector<std::string> notes = model->enable_activation_checkpointing(section);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("partition_activations"), std::string::npos);
  EXPECT_NE(notes[1].find("contiguous_memory_optimization"), std::string::npos);
  section = {};
  section.number_checkpoints = 4;  // three blocks
  std::string e = config_error([&] { model->enable_activation_checkpointing(section); });
  EXPECT_NE(e.find("activation_checkpointing.number_checkpoints"), std::string::npos) << e;
  // The GPT config's own switch.
  json j = small_json();
  j["checkpoint_activations"] = true;
  EXPECT_EQ(mz::GPT(mz::GPTConfig::from_json(j))->activation_checkpointing_segments(), 3);
}

// An auxiliary loss added inside a checkpoint (nn/aux_loss.h) reaches the caller's scope and
// gets its gradient through the recompute; recomputing() holds only while backward recomputes.
TEST(ActivationCheckpointing, AuxLossesSurviveTheRecompute) {
  at::manual_seed(0);
  at::Tensor w = at::randn({5, 5}).requires_grad_();
  at::Tensor x = at::randn({3, 5}).requires_grad_();
  std::vector<bool> seen;  // recomputing() at each run
  auto fn = [&](const at::Tensor& in) {
    seen.push_back(ac::recomputing());
    at::Tensor h = at::dropout(at::tanh(in.matmul(w)), 0.3, true);
    dscpp::nn::add_aux_loss(0.1 * h.pow(2).mean());
    dscpp::nn::add_aux_loss(w.abs().sum() * 0.01);
    return h;
  };
  auto run = [&](bool checkpointed) {
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    seen.clear();
    at::manual_seed(4);
    dscpp::nn::AuxLossScope scope;
    at::Tensor out = checkpointed ? ac::checkpoint(fn, x) : fn(x);
    EXPECT_TRUE(scope.sum().defined());
    EXPECT_FALSE(ac::recomputing());
    (out.sum() + 3.0 * scope.sum()).backward();
    return std::vector<at::Tensor>{scope.sum().detach(), w.grad().clone(), x.grad().clone()};
  };
  auto plain = run(false);
  EXPECT_EQ(seen, std::vector<bool>({false}));
  auto ckpt = run(true);
  EXPECT_EQ(seen, std::vector<bool>({false, true}));  // the forward, then the recompute
  const char* what[] = {"aux sum", "w.grad", "x.grad"};
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << what[i];
  // Outside every scope the checkpoint's losses are refused as the layer's own would be.
  EXPECT_THROW(ac::checkpoint(fn, x), dscpp::Error);
}

// A checkpoint inside a checkpoint: the inner one's aux loss reaches the outer run's scope
// (in the outer first run directly, the inner checkpoint not recording there; in the outer
// recompute through the inner checkpoint's output), counted once, its gradient as without
// checkpoints; recomputing() holds in both recomputes.
TEST(ActivationCheckpointing, NestedCheckpointsCarryAuxLossesOnce) {
  at::manual_seed(0);
  at::Tensor w = at::randn({5, 5}).requires_grad_();
  at::Tensor x = at::randn({3, 5}).requires_grad_();
  std::vector<bool> seen;  // recomputing() at each run of the inner function
  auto inner = [&](const at::Tensor& in) {
    seen.push_back(ac::recomputing());
    at::Tensor h = at::tanh(in.matmul(w));
    dscpp::nn::add_aux_loss(0.2 * h.pow(2).mean());
    return h;
  };
  bool nested = false;
  auto outer = [&](const at::Tensor& in) {
    at::Tensor h = nested ? ac::checkpoint(inner, in * 2) : inner(in * 2);
    dscpp::nn::add_aux_loss(0.05 * in.abs().sum());
    return h.sin();
  };
  auto run = [&](bool checkpointed) {
    w.mutable_grad() = at::Tensor();
    x.mutable_grad() = at::Tensor();
    seen.clear();
    nested = checkpointed;
    dscpp::nn::AuxLossScope scope;
    at::Tensor out = checkpointed ? ac::checkpoint(outer, x) : outer(x);
    (out.sum() + 2.0 * scope.sum()).backward();
    return std::vector<at::Tensor>{scope.sum().detach(), w.grad().clone(), x.grad().clone()};
  };
  auto plain = run(false);
  auto ckpt = run(true);
  // The outer forward (no grad: the inner function runs plainly), the outer recompute (the
  // inner checkpoint's first run), the inner recompute.
  EXPECT_EQ(seen, std::vector<bool>({false, true, true}));
  const char* what[] = {"aux sum", "w.grad", "x.grad"};
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_TRUE(at::equal(plain[i], ckpt[i])) << what[i];
}

// The recompute must add aux losses exactly when the first run did: otherwise the loss the
// caller took and the gradient backward gives would disagree, which is refused by name.
TEST(ActivationCheckpointing, RecomputeWithOtherAuxLossesIsRefused) {
  at::Tensor x = at::randn({4}).requires_grad_();
  for (bool first_adds : {true, false}) {
    int runs = 0;
    auto fn = [&](const at::Tensor& in) {
      if ((runs++ == 0) == first_adds) dscpp::nn::add_aux_loss(in.sum());
      return in * 3;
    };
    dscpp::nn::AuxLossScope scope;
    at::Tensor out = ac::checkpoint(fn, x);
    EXPECT_EQ(scope.sum().defined(), first_adds);
    at::Tensor loss = scope.sum().defined() ? out.sum() + scope.sum() : out.sum();
    try {
      loss.backward();
      ADD_FAILURE() << "a recompute with other aux losses than its first run was accepted";
    } catch (const std::exception& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("the recomputed function"), std::string::npos) << what;
      EXPECT_NE(what.find(first_adds ? "added no auxiliary loss" : "added auxiliary losses"),
                std::string::npos)
          << what;
    }
    EXPECT_EQ(runs, 2);
  }
}

// The MoE GPT (aux loss, z-loss, expert bias) with checkpoint_activations: the same loss, aux
// sum and gradients bit for bit, and the routing counted once (the routers' expert-bias counts
// and the blocks' statistics as without checkpoints).
TEST(ActivationCheckpointing, MoEGPTMatchesPlainAndCountsOnce) {
  json j = small_json();
  j.update({{"hidden_dropout", 0.1},
            {"gelu_approximation", "none"},
            {"num_experts", 4},
            {"moe_router_topk", 2},
            {"moe_ffn_hidden_size", 16},
            {"moe_router_score_function", "sigmoid"},
            {"moe_aux_loss_coeff", 0.01},
            {"moe_z_loss_coeff", 0.001},
            {"moe_router_enable_expert_bias", true}});
  const mz::GPTConfig c = mz::GPTConfig::from_json(j);
  at::manual_seed(3);
  mz::GPT model(c);
  const Batch b = random_batch(c, 4, 16, 4);
  struct Result {
    at::Tensor loss, aux;
    std::map<std::string, at::Tensor> grads;
    std::vector<at::Tensor> counts;
    std::vector<mz::MoELayerStats> stats;
  };
  auto run = [&] {
    zero_grads(*model);
    at::manual_seed(11);
    dscpp::nn::AuxLossScope scope;
    at::Tensor loss = model->loss(model->forward(b.ids), b.targets);
    (loss + scope.sum()).backward();
    Result r{loss.detach(), scope.sum().detach(), grads_of(*model), {}, mz::take_moe_stats(*model)};
    for (const auto& m : model->modules())
      if (auto* gate = m->as<dscpp::nn::moe::TopKGateImpl>()) {
        r.counts.push_back(gate->tokens_per_expert().clone());
        // Restart the count, the bias kept: the next run routes as this one did.
        const at::Tensor bias = gate->expert_bias.clone();
        gate->update_expert_bias();
        gate->expert_bias.copy_(bias);
      }
    return r;
  };
  const Result plain = run();
  model->enable_activation_checkpointing();
  const Result ckpt = run();
  expect_loss_match(ckpt.loss, plain.loss);
  expect_loss_match(ckpt.aux, plain.aux);
  expect_grads_match(plain.grads, ckpt.grads);
  ASSERT_EQ(plain.counts.size(), 3u);
  ASSERT_EQ(ckpt.counts.size(), 3u);
  for (size_t i = 0; i < plain.counts.size(); ++i) {
    EXPECT_TRUE(at::equal(plain.counts[i], ckpt.counts[i])) << "router " << i;
    EXPECT_EQ(ckpt.counts[i].sum().item<double>(), 4 * 16 * 2);  // B x S tokens x top-2
  }
  ASSERT_EQ(ckpt.stats.size(), 3u);
  for (size_t i = 0; i < ckpt.stats.size(); ++i) {
    EXPECT_EQ(ckpt.stats[i].forwards, 1);
    EXPECT_TRUE(at::equal(plain.stats[i].tokens_per_expert, ckpt.stats[i].tokens_per_expert));
  }
}

TEST(ActivationCheckpointing, PeakCpuMemoryDrops) {
  mz::GPTConfig c = memory_config();
  at::manual_seed(0);
  mz::GPT model(c);
  Batch b = random_batch(c, 8, c.seq_length, 1);
  MemoryUse plain = cpu_memory_of_step(model, b);
  model->enable_activation_checkpointing();
  MemoryUse ckpt = cpu_memory_of_step(model, b);
  const double mib = 1024.0 * 1024.0;
  std::cout << "CPU bytes held after forward: " << plain.after_forward / mib << " MiB plain, "
            << ckpt.after_forward / mib << " MiB checkpointed; peak " << plain.peak / mib
            << " MiB plain, " << ckpt.peak / mib << " MiB checkpointed\n";
  // Checkpointed, a forward keeps each block's input ([B,S,h]) instead of everything the
  // block's backward needs (attention probabilities and dropout masks among them).
  EXPECT_LT(ckpt.after_forward, plain.after_forward / 4);
  EXPECT_LT(ckpt.peak, plain.peak / 2);
}

#if defined(DSCPP_CUDA)
TEST(ActivationCheckpointing, PeakCudaMemoryDrops) {
  DSCPP_SKIP_WITHOUT_CUDA();
  const at::Device gpu(at::kCUDA, 0);
  mz::GPTConfig c = memory_config();
  at::manual_seed(0);
  mz::GPT model(c);
  model->to(gpu);
  Batch b = random_batch(c, 8, c.seq_length, 1);
  b.ids = b.ids.to(gpu);
  b.targets = b.targets.to(gpu);
  auto measure = [&](std::map<std::string, at::Tensor>* grads) {
    zero_grads(*model);
    at::accelerator::synchronizeDevice(0);
    const int64_t base = at::accelerator::getDeviceStats(0).allocated_bytes[0].current;
    at::accelerator::resetPeakStats(0);
    at::manual_seed(7);
    model->loss(model->forward(b.ids), b.targets).backward();
    at::accelerator::synchronizeDevice(0);
    *grads = grads_of(*model);
    return at::accelerator::getDeviceStats(0).allocated_bytes[0].peak - base;
  };
  std::map<std::string, at::Tensor> plain_grads, ckpt_grads, host_grads;
  // A first step allocates what stays for good (cuBLAS workspaces): not the model's peak.
  measure(&plain_grads);
  const int64_t plain = measure(&plain_grads);
  model->enable_activation_checkpointing();
  const int64_t ckpt = measure(&ckpt_grads);
  dscpp::ActivationCheckpointingConfig on_cpu;
  on_cpu.cpu_checkpointing = true;
  model->enable_activation_checkpointing(on_cpu);
  const int64_t host = measure(&host_grads);
  std::cout << "CUDA peak above the weights: " << plain / 1048576.0 << " MiB plain, "
            << ckpt / 1048576.0 << " MiB checkpointed, " << host / 1048576.0
            << " MiB with cpu_checkpointing\n";
  EXPECT_LT(ckpt, plain / 2);
  EXPECT_LT(host, ckpt);
  // GPU kernels may sum in a different order from run to run (atomics): close, not equal.
  for (const auto& [name, g] : plain_grads) {
    EXPECT_TRUE(at::allclose(g, ckpt_grads.at(name), 1e-4, 1e-6)) << name;
    EXPECT_TRUE(at::allclose(g, host_grads.at(name), 1e-4, 1e-6)) << name;
  }
}
#endif

// ---- with the engine -------------------------------------------------------------------------
