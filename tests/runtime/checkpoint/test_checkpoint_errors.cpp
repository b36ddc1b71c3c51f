// Engine checkpoints in one process (a world of one): what load_checkpoint restores and its
// switches, and every kind of bad input as a CheckpointError that names the problem. Multi-rank
// resume, other rank counts and DeepSpeed interop: checkpoint_oracle.py.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <filesystem>
#include <fstream>

#include "dscpp/dscpp.h"
#include "dscpp/optim/optimizer.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/zero/gathered_parameters.h"
#include "dscpp/zero/zero_optimizer.h"

using dscpp::checkpoint::CheckpointError;
using dscpp::checkpoint::PyValue;
using nlohmann::json;
namespace fs = std::filesystem;

namespace {

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t hidden = 8) {
    a = register_module("a", torch::nn::Linear(4, hidden));
    b = register_module("b", torch::nn::Linear(hidden, 2));
  }
  at::Tensor forward(at::Tensor x) { return b(a(x).tanh()); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

json config(int stage) {
  return {{"train_batch_size", 4},
          {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.05}}}}},
          {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}}},
          {"zero_optimization", {{"stage", stage}}}};
}

template <typename E>
void train(E& engine, int steps) {
  for (int s = 0; s < steps; ++s) {
    at::Tensor x = at::sin(at::arange(16, at::kFloat).reshape({4, 4}) * (engine.global_steps() + 1))
                       .to(engine.device());
    at::Tensor loss = engine.forward(x).square().mean();
    engine.backward(loss);
    engine.step();
  }
}

at::Tensor weights(Net& m) {
  std::vector<at::Tensor> all;
  for (const auto& p : m->parameters()) all.push_back(p.detach().flatten().cpu().clone());
  return at::cat(all);
}

class Checkpoints : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dscpp_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  // A checkpoint of 3 steps at `stage`, tag global_step3.
  void save(int stage) {
    torch::manual_seed(0);
    Net net;
    auto engine = dscpp::initialize(net, config(stage));
    train(engine, 3);
    engine.save_checkpoint(dir());
  }
  fs::path dir_;
};

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError)";
}

}  // namespace

TEST_F(Checkpoints, ResumeContinuesExactlyAndRestoresCountersAndSchedule) {
  for (int stage : {0, 1, 2}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    fs::remove_all(dir_);
    torch::manual_seed(0);
    Net a;
    auto ea = dscpp::initialize(a, config(stage));
    train(ea, 3);
    auto client = PyValue::dict();
    client.set("epoch", 7);
    ea.save_checkpoint(dir(), "", client);
    const std::vector<double> lr_at_save = ea.get_lr();
    train(ea, 2);

    torch::manual_seed(1);  // other initial weights: all must come from the checkpoint
    Net b;
    auto eb = dscpp::initialize(b, config(stage));
    auto loaded = eb.load_checkpoint(dir());
    EXPECT_EQ(loaded.path, (dir_ / "global_step3").string());
    EXPECT_EQ(loaded.client_state.to_json(), json({{"epoch", 7}}));
    EXPECT_EQ(eb.global_steps(), 3);
    EXPECT_EQ(eb.global_samples(), 12);
    EXPECT_EQ(eb.get_lr(), lr_at_save);  // WarmupLR's position came back
    train(eb, 2);
    EXPECT_TRUE(at::equal(weights(a), weights(b)));
    EXPECT_EQ(ea.get_lr(), eb.get_lr());
  }
}

TEST_F(Checkpoints, LoadOptimizerStatesFalseKeepsAFreshOptimizer) {
  save(2);
  torch::manual_seed(1);
  Net b;
  auto eb = dscpp::initialize(b, config(2));
  eb.load_checkpoint(dir(), "", /*load_module_strict=*/true, /*load_optimizer_states=*/false);
  auto& opt = eb.core().zero_optimizer().optimizer();
  EXPECT_EQ(opt.step_count(0), 0);
  for (auto& [name, t] : opt.state(0)) EXPECT_EQ(t.abs().sum().item<double>(), 0.0) << name;
  EXPECT_EQ(eb.global_steps(), 3);
}

TEST_F(Checkpoints, LoadModuleOnlyTakesTheWeightsAndNothingElse) {
  save(1);
  torch::manual_seed(0);
  Net a;
  auto ea = dscpp::initialize(a, config(1));
  train(ea, 3);
  torch::manual_seed(1);
  Net b;
  auto eb = dscpp::initialize(b, config(1));
  eb.load_checkpoint(dir(), "", true, true, true, /*load_module_only=*/true);
  EXPECT_TRUE(at::equal(weights(a), weights(b)));
  EXPECT_EQ(eb.global_steps(), 0);
  EXPECT_EQ(eb.core().zero_optimizer().optimizer().step_count(0), 0);
  // The fp32 master weights follow the loaded module (a world of one: the partition is the
  // whole flat buffer), so the next step starts from them.
  auto& zo = eb.core().zero_optimizer();
  EXPECT_TRUE(at::equal(zo.master_partition(), zo.flat_params().to(at::kFloat)));
}

// DeepSpeed's load_checkpoint warns and returns (None, None): nothing loaded, no error.
TEST_F(Checkpoints, NoLatestFileWarnsAndLoadsNothing) {
  fs::create_directories(dir_);
  torch::manual_seed(0);
  Net b;
  at::Tensor before = weights(b);
  auto eb = dscpp::initialize(b, config(1));
  ::testing::internal::CaptureStderr();
  auto r = eb.load_checkpoint(dir());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(r.path.empty());
  EXPECT_EQ(eb.global_steps(), 0);
  EXPECT_TRUE(at::equal(weights(b), before));
  EXPECT_NE(err.find("Unable to find latest file at " + (dir_ / "latest").string() +
                     ", if trying to load latest checkpoint please ensure this file exists or "
                     "pass an explicit checkpoint tag when loading a checkpoint."),
            std::string::npos)
      << err;
}

// `latest` is outside input: bounded, and a tag or an error naming it.
TEST_F(Checkpoints, LatestThatIsNoTagIsAnErrorNamingIt) {
  save(0);
  const std::string latest = (dir_ / "latest").string();
  std::ofstream(latest) << "  global_step3\n";  // DeepSpeed strips the whitespace
  EXPECT_EQ(dscpp::checkpoint::read_latest(dir()), "global_step3");
  Net b;
  auto eb = dscpp::initialize(b, config(0));
  std::ofstream(latest) << std::string(100000, 'x');
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("'" + latest + "' is longer than 4096 bytes"), std::string::npos) << e;
  std::ofstream(latest) << "global\x01step3";
  e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("'" + latest + "' holds a control character (byte 6)"), std::string::npos) << e;
  std::ofstream(latest) << " \n";
  e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("'" + latest + "' is empty"), std::string::npos) << e;
}

// One rank: a partition of another save with the same step, and a model-states file of
// another step, are refused naming both files and both values (2 ranks:
// checkpoint_binding.py).
TEST_F(Checkpoints, FilesOfAnotherSaveAreRefusedNamingBoth) {
  save(1);  // global_step3
  const fs::path first = dir_ / "first";
  fs::rename(dir_ / "global_step3", first);
  save(1);  // the same step, another save
  auto id = [](const fs::path& p) {
    return dscpp::checkpoint::load_torch_file(p.string()).at("dscpp_save_id").as_string();
  };
  const fs::path tag = dir_ / "global_step3";
  const fs::path part = tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
  const fs::path model = tag / "mp_rank_00_model_states.pt";
  const std::string ours = id(model), theirs = id(first / part.filename());
  ASSERT_NE(ours, theirs);
  EXPECT_EQ(id(part), ours);
  fs::copy_file(first / part.filename(), part, fs::copy_options::overwrite_existing);
  Net b;
  auto eb = dscpp::initialize(b, config(1));
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  for (const std::string& want : {"'" + part.string() + "' (save " + theirs + ", step 3)",
                                  "'" + model.string() + "' (save " + ours + ", step 3)",
                                  std::string("not written by the same save")})
    EXPECT_NE(e.find(want), std::string::npos) << want << "\n" << e;
  // And a model-states file of another step, beside the partitions of step 3.
  {
    torch::manual_seed(0);
    Net c;
    auto ec = dscpp::initialize(c, config(1));
    train(ec, 5);
    ec.save_checkpoint((dir_ / "later").string());
  }
  fs::copy_file(dir_ / "later" / "global_step5" / model.filename(), model,
                fs::copy_options::overwrite_existing);
  e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("step 3) and '" + model.string() + "' (save "), std::string::npos) << e;
  EXPECT_NE(e.find(", step 5)"), std::string::npos) << e;
}

// Without dscpp_save_id (DeepSpeed's files) the partitions are checked as DeepSpeed does: a
// file from another save loads (as it would in DeepSpeed) once no file of the tag has one.
TEST_F(Checkpoints, FilesWithoutSaveIdKeepDeepSpeedsChecks) {
  save(1);
  const fs::path tag = dir_ / "global_step3";
  for (const char* f :
       {"mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"}) {
    PyValue v = dscpp::checkpoint::load_torch_file((tag / f).string());
    PyValue stripped = PyValue::dict();
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string& k = v.keys()[i].as_string();
      if (k != "dscpp_save_id" && k != "dscpp_rank" && k != "dscpp_world_size" &&
          k != "dscpp_global_steps")
        stripped.set(v.keys()[i], v.values()[i]);
    }
    dscpp::checkpoint::save_torch_file(stripped, (tag / f).string());
  }
  Net b;
  auto eb = dscpp::initialize(b, config(1));
  eb.load_checkpoint(dir());
  EXPECT_EQ(eb.global_steps(), 3);
}

TEST_F(Checkpoints, MissingTagIsAnErrorNamingIt) {
  save(0);
  Net b;
  auto eb = dscpp::initialize(b, config(0));
  std::string e = error_of([&] { eb.load_checkpoint(dir(), "global_step99"); });
  EXPECT_NE(e.find("no checkpoint 'global_step99'"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { eb.load_checkpoint(dir(), "../x"); }).find("not a folder name"),
            std::string::npos);
}

TEST_F(Checkpoints, TruncatedFileIsAnErrorNamingIt) {
  save(1);
  const fs::path model = dir_ / "global_step3" / "mp_rank_00_model_states.pt";
  fs::resize_file(model, fs::file_size(model) / 2);
  Net b;
  auto eb = dscpp::initialize(b, config(1));
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find(model.string()), std::string::npos) << e;
}

TEST_F(Checkpoints, CorruptedPartitionIsAnErrorNamingIt) {
  save(2);
  const fs::path zero = dir_ / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt";
  {
    // Flip the first bytes of a tensor record's data (found through its zip local header:
    // 30 bytes, the name, then an extra field whose length is at offset 28).
    std::fstream f(zero, std::ios::in | std::ios::out | std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::string name = "/data/1";
    size_t at = bytes.find(name);
    ASSERT_NE(at, std::string::npos);
    size_t header = bytes.rfind("PK\x03\x04", at);
    ASSERT_NE(header, std::string::npos);
    auto u16 = [&](size_t i) {
      return static_cast<size_t>(static_cast<unsigned char>(bytes[i])) |
             static_cast<size_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    };
    size_t data = header + 30 + u16(header + 26) + u16(header + 28);
    f.clear();
    f.seekp(static_cast<std::streamoff>(data));
    f.write("\xde\xad\xbe\xef", 4);
  }
  Net b;
  auto eb = dscpp::initialize(b, config(2));
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find(zero.string()), std::string::npos) << e;
}

TEST_F(Checkpoints, AnotherModelIsAnErrorListingTheDifferences) {
  save(1);
  Net other(16);  // hidden 16: a.weight, a.bias and b.weight change shape
  auto eb = dscpp::initialize(other, config(1));
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("checkpoint of another model"), std::string::npos) << e;
  EXPECT_NE(e.find("a.weight (checkpoint 8x4, model 16x4)"), std::string::npos) << e;
  EXPECT_NE(e.find("b.weight"), std::string::npos) << e;
}

// Another ZeRO stage loads through the checkpoint's normal form (every parameter whole by
// name): it continues as the engine that saved it does, counters and schedule included. (The
// multi-rank pairs of stages and rank counts: checkpoint_oracle.py's stages part.)
TEST_F(Checkpoints, AnotherStageContinuesAsTheSavingEngine) {
  for (auto [saved, loaded] : {std::pair{0, 2}, {1, 2}, {2, 0}, {3, 1}}) {
    SCOPED_TRACE(fmt::format("stage {} -> {}", saved, loaded));
    fs::remove_all(dir_);
    torch::manual_seed(0);
    Net a;
    auto ea = dscpp::initialize(a, config(saved));
    train(ea, 3);
    ea.save_checkpoint(dir());
    train(ea, 2);
    torch::manual_seed(1);  // other initial weights: all must come from the checkpoint
    Net b;
    auto eb = dscpp::initialize(b, config(loaded));
    eb.load_checkpoint(dir());
    EXPECT_EQ(eb.global_steps(), 3);
    train(eb, 2);
    dscpp::zero::GatheredParameters ga(ea.core().zero_optimizer()), gb(eb.core().zero_optimizer());
    EXPECT_TRUE(at::allclose(weights(b), weights(a), 1e-6, 1e-6))
        << (weights(b) - weights(a)).abs().max().item<float>();
  }
}

// DeepSpeed writes no dscpp_loss_scaler: its (pickled) LossScaler lies in the first ZeRO file's
// optimizer_state_dict, read from there as a dict of its fields, with that file's partition.
TEST_F(Checkpoints, DeepSpeedsLossScalerComesFromTheFirstPartitionFile) {
  json c = config(1);
  c["fp16"] = {{"enabled", true}, {"initial_scale_power", 10}};
  {
    torch::manual_seed(0);
    Net a;
    auto ea = dscpp::initialize(a, c);
    ea.save_checkpoint(dir(), "t");  // (no step: the scale is the initial 1024)
  }
  const std::string model_path = (dir_ / "t" / "mp_rank_00_model_states.pt").string();
  const std::string zero_path = (dir_ / "t" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").string();
  PyValue model = dscpp::checkpoint::load_torch_file(model_path);
  ASSERT_TRUE(model.contains(PyValue("dscpp_loss_scaler")));
  PyValue kept = PyValue::dict();
  for (size_t i = 0; i < model.size(); ++i)
    if (model.keys()[i].as_string() != "dscpp_loss_scaler")
      kept.set(model.keys()[i], model.values()[i]);
  dscpp::checkpoint::save_torch_file(kept, model_path);
  PyValue zero = dscpp::checkpoint::load_torch_file(zero_path);
  PyValue osd = zero.at(PyValue("optimizer_state_dict"));
  osd.set(PyValue("loss_scaler"), PyValue::from_json({{"__class__", "DynamicLossScaler"},
                                                      {"cur_scale", 96.0},
                                                      {"cur_iter", 3},
                                                      {"last_overflow_iter", -1},
                                                      {"cur_hysteresis", 2}}));
  zero.set(PyValue("optimizer_state_dict"), osd);
  dscpp::checkpoint::save_torch_file(zero, zero_path);
  Net b;
  auto eb = dscpp::initialize(b, c);
  eb.load_checkpoint(dir());
  EXPECT_EQ(eb.loss_scale(), 96.0);
}

// A normal form that cannot be made names the file it lacks.
TEST_F(Checkpoints, AnotherStageWithAMissingPartitionFileNamesIt) {
  save(1);
  fs::remove(dir_ / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  Net b;
  auto eb = dscpp::initialize(b, config(0));
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("zero_pp_rank_0_mp_rank_00_optim_states.pt"), std::string::npos) << e;
}

TEST_F(Checkpoints, MissingPartitionFileIsAnError) {
  save(1);
  fs::remove(dir_ / "global_step3" / "zero_pp_rank_0_mp_rank_00_optim_states.pt");
  Net b;
  auto eb = dscpp::initialize(b, config(1));
  std::string e = error_of([&] { eb.load_checkpoint(dir()); });
  EXPECT_NE(e.find("no ZeRO partition file of rank 0"), std::string::npos) << e;
}

TEST_F(Checkpoints, AFailedSaveLeavesLatestOnThePreviousCheckpoint) {
  torch::manual_seed(0);
  Net a;
  auto ea = dscpp::initialize(a, config(2));
  train(ea, 3);
  ea.save_checkpoint(dir());
  at::Tensor saved = weights(a);
  train(ea, 1);
  // A file where the next tag's folder must go: the save fails part-way.
  std::ofstream(dir_ / "global_step4") << "in the way";
  EXPECT_THROW(ea.save_checkpoint(dir()), CheckpointError);
  EXPECT_EQ(dscpp::checkpoint::read_latest(dir()), "global_step3");
  torch::manual_seed(1);
  Net b;
  auto eb = dscpp::initialize(b, config(2));
  eb.load_checkpoint(dir());
  EXPECT_TRUE(at::equal(weights(b), saved));
}

TEST_F(Checkpoints, ClientStateMayNotUseTheEngineKeys) {
  Net a;
  auto ea = dscpp::initialize(a, config(0));
  auto client = PyValue::dict();
  client.set("global_steps", 5);
  EXPECT_THROW(ea.save_checkpoint(dir(), "", client), dscpp::Error);
  EXPECT_FALSE(fs::exists(dir_ / "latest"));
}

TEST_F(Checkpoints, ParameterGroupsResumeExactly) {
  for (int stage : {0, 2, 3}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    fs::remove_all(dir_);
    dscpp::InitArgs args;
    args.param_groups.push_back({{"b.weight", "b.bias"}, {{"lr", 0.01}, {"weight_decay", 0.3}}});
    torch::manual_seed(0);
    Net a;
    auto ea = dscpp::initialize(a, config(stage), args);
    train(ea, 3);
    ea.save_checkpoint(dir());
    train(ea, 2);
    torch::manual_seed(1);
    Net b;
    auto eb = dscpp::initialize(b, config(stage), args);
    eb.load_checkpoint(dir());
    train(eb, 2);
    auto full = [&](Net& m, auto& e) {
      dscpp::zero::GatheredParameters g(e.core().zero_optimizer());
      return weights(m);
    };
    EXPECT_TRUE(at::equal(full(a, ea), full(b, eb)));
    EXPECT_EQ(ea.get_lr(), eb.get_lr());
    EXPECT_EQ(eb.get_lr().size(), 2u);
  }
}
