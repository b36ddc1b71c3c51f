// Every DeepSpeed config of the wild set (DSCPP_WILD_DIR: configs collected from public
// projects) loads or is refused with a clear message, as tests/config/wild_expectations.json
// says for that file. A file without an
// expectation fails, so a new file in the set is looked at, not skipped.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

json read_json(const std::string& path) {
  std::ifstream in(path);
  return json::parse(in);
}

// The values a Hugging Face Trainer would put in place of "auto".
json hf_auto_values(int64_t world) {
  return {{"train_micro_batch_size_per_gpu", 2},
          {"gradient_accumulation_steps", 1},
          {"train_batch_size", 2 * world},
          {"gradient_clipping", 1.0},
          {"optimizer.params.lr", 1e-4},
          {"optimizer.params.betas", {0.9, 0.999}},
          {"optimizer.params.eps", 1e-8},
          {"optimizer.params.weight_decay", 0.01},
          {"scheduler.params.warmup_min_lr", 0},
          {"scheduler.params.warmup_max_lr", 1e-4},
          {"scheduler.params.warmup_num_steps", 100},
          {"scheduler.params.total_num_steps", 1000},
          {"zero_optimization.reduce_bucket_size", 1048576},
          {"zero_optimization.stage3_prefetch_bucket_size", 943718},
          {"zero_optimization.stage3_param_persistence_threshold", 10240}};
}

// What the engine does with the offload a loaded config asks for (engine_core.cpp): the
// optimizer's offload to the CPU or to NVMe (ZeRO-Infinity's swap files) is acted on at
// stages 1-3, the parameters' to the CPU or to NVMe at stage 3; parameter offload at stages
// 0-2, and the optimizer's at stage 0, are announced.
// Empty: the config asks for none.
json offload_fate(const dscpp::DSConfig& c) {
  json fate = json::object();
  const auto& z = c.zero_optimization;
  if (z.offload_optimizer && z.offload_optimizer->device != "none")
    fate["optimizer"] = z.stage >= 1 && z.stage <= 3 ? "acted on" : "announced";
  if (z.offload_param && z.offload_param->device != "none")
    fate["param"] = z.stage == 3 ? "acted on" : "announced";
  return fate;
}

}  // namespace

TEST(WildConfigs, EachLoadsOrIsRefusedAsExpected) {
  // The set lives in the project's shared folder beside the checkout; a machine given only
  // the checkout (the GPU machine) has no copy.
  if (!fs::is_directory(DSCPP_WILD_DIR)) {
    GTEST_SKIP() << "no " << DSCPP_WILD_DIR << " here";
  }
  json expect = read_json(std::string(DSCPP_TEST_DIR) + "/wild_expectations.json");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(DSCPP_WILD_DIR)) {
    std::string name = entry.path().filename().string();
    if (name == "README.md" || name == "SOURCES.tsv") continue;
    ++files;
    SCOPED_TRACE(name);
    ASSERT_TRUE(expect.contains(name)) << "no expectation written down for " << name;
    const json& e = expect[name];
    dscpp::ConfigOptions o;
    o.world_size = e.value("world_size", 1);
    o.auto_values = hf_auto_values(o.world_size);
    if (e.contains("auto")) o.auto_values.update(e["auto"]);
    std::string error;
    dscpp::DSConfig loaded;
    try {
      loaded = dscpp::load_ds_config(entry.path().string(), o);
    } catch (const dscpp::ConfigError& err) {
      error = err.what();
    }
    if (e["outcome"] == "accept") {
      EXPECT_EQ(error, "") << "expected to load";
      EXPECT_EQ(offload_fate(loaded), e.value("offload", json::object())) << "offload";
    } else {
      ASSERT_NE(error, "") << "expected a refusal mentioning: " << e["error"];
      EXPECT_NE(error.find(e["error"].get<std::string>()), std::string::npos) << error;
    }
  }
  EXPECT_EQ(files, static_cast<int>(expect.size())) << "expectations for files that are gone";
}
