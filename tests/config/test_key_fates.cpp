// Nothing silent: every key the config reader resolves has a fate in
// config/key_fates.cpp, every acted-on key names a test that exists, every refused key is
// refused by name, and every announced key is announced once at start-up. Features whose
// absence changes what is trained are refused, not accepted.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/config/key_fates.h"

namespace fs = std::filesystem;
using dscpp::config::Fate;
using dscpp::config::find_key_fate;
using dscpp::config::key_fates;
using nlohmann::json;

namespace {

// A config that reaches every branch of the reader: each section present, both offload
// sections, an optimizer and a schedule (what DeepSpeed documents, as to_json writes it).
json full_config() {
  json j = {{"train_batch_size", 4},
            {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 1e-3}}}}},
            {"scheduler", {{"type", "WarmupLR"}, {"params", {{"warmup_num_steps", 10}}}}},
            {"zero_optimization",
             {{"stage", 3},
              {"offload_optimizer", {{"device", "cpu"}}},
              {"offload_param", {{"device", "cpu"}}}}}};
  json out = dscpp::to_json(dscpp::parse_ds_config(j));
  out.erase("steps_per_print");  // null: unset
  return out;
}

std::set<std::string> resolved_by(const json& j, int64_t world = 1, json autos = json::object()) {
  dscpp::ConfigOptions o;
  o.world_size = world;
  o.auto_values = std::move(autos);
  auto c = dscpp::parse_ds_config(j, o);
  return {c.resolved_keys.begin(), c.resolved_keys.end()};
}

// Every key resolved for the full config, the shipped ds_configs/ and the wild set.
std::set<std::string> all_resolved_keys() {
  std::set<std::string> keys = resolved_by(full_config());
  auto more = resolved_by({{"zero_optimization", true}, {"train_batch_size", 1}});
  keys.insert(more.begin(), more.end());
  more = resolved_by({{"train_batch_size", 1}, {"bfloat16", {{"enabled", true}}}});
  keys.insert(more.begin(), more.end());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(DSCPP_TEST_DIR) / "../../ds_configs"))
    if (e.path().extension() == ".json") files.push_back(e.path());
  if (fs::is_directory(DSCPP_WILD_DIR))
    for (const auto& e : fs::directory_iterator(DSCPP_WILD_DIR))
      if (e.path().extension() == ".json") files.push_back(e.path());
  for (const auto& f : files) {
    dscpp::ConfigOptions o;
    o.auto_values = {{"train_micro_batch_size_per_gpu", 2},
                     {"train_batch_size", 2},
                     {"gradient_accumulation_steps", 1}};
    try {
      auto c = dscpp::load_ds_config(f.string(), o);
      keys.insert(c.resolved_keys.begin(), c.resolved_keys.end());
    } catch (const dscpp::ConfigError&) {
      // Refused (test_wild_configs checks why): it resolved only part of its keys.
    }
  }
  return keys;
}

// The config {"train_batch_size": 1} with `value` at the dotted `path` (and what the reader
// needs to reach it: a typed optimizer or schedule, the old boolean zero_optimization).
json with_value(const std::string& path, const json& value) {
  json j = {{"train_batch_size", 1}};
  if (path.rfind("optimizer.", 0) == 0) j["optimizer"]["type"] = "Adam";
  if (path.rfind("scheduler.", 0) == 0) j["scheduler"]["type"] = "WarmupLR";
  if (path == "allgather_size") j["zero_optimization"] = true;
  json* node = &j;
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return j;
    }
    node = &(*node)[part];
    start = dot + 1;
  }
}

// gtest names (Suite.Name) and ctest names (add_test(NAME x)) under tests/.
std::set<std::string> test_names() {
  std::set<std::string> names;
  std::regex gtest(R"(\bTEST(?:_F|_P)?\(\s*(\w+)\s*,\s*(\w+)\s*\))");
  std::regex ctest(R"(add_test\(NAME\s+([\w.]+))");
  for (const auto& e : fs::recursive_directory_iterator(fs::path(DSCPP_TEST_DIR) / "..")) {
    const std::string ext = e.path().extension().string();
    const std::string name = e.path().filename().string();
    if (ext != ".cpp" && ext != ".cmake" && name != "CMakeLists.txt") continue;
    std::ifstream in(e.path());
    std::stringstream buf;
    buf << in.rdbuf();
    const std::string text = buf.str();
    for (std::sregex_iterator it(text.begin(), text.end(), gtest), end; it != end; ++it)
      names.insert((*it)[1].str() + "." + (*it)[2].str());
    for (std::sregex_iterator it(text.begin(), text.end(), ctest), end; it != end; ++it)
      names.insert((*it)[1].str());
  }
  return names;
}

// The start-up lines that announce `path`: naming it, a section above it, or a key under it.
std::string announcement_of(const std::vector<std::string>& ignored, const std::string& path) {
  std::string found;
  for (const auto& line : ignored) {
    bool names = line.find("'" + path + ".") != std::string::npos;
    for (size_t dot = 0; !names && dot != std::string::npos; dot = path.find('.', dot + 1))
      names = line.find("'" + path.substr(0, dot == 0 ? std::string::npos : dot) + "'") !=
              std::string::npos;
    if (names) found += line + "\n";
  }
  return found;
}

}  // namespace

TEST(KeyFates, EveryResolvedKeyHasAFate) {
  for (const auto& key : all_resolved_keys())
    EXPECT_NE(find_key_fate(key), nullptr)
        << "the reader resolves '" << key << "' but config/key_fates.cpp gives it no fate";
}

TEST(KeyFates, EveryEntryIsAKeyTheReaderResolves) {
  std::set<std::string> canonical;
  for (const auto& key : all_resolved_keys()) canonical.insert(dscpp::config::canonical_key(key));
  std::set<std::string> seen;
  for (const auto& f : key_fates()) {
    EXPECT_TRUE(canonical.count(f.path)) << "stale entry: the reader never resolves " << f.path;
    EXPECT_TRUE(seen.insert(f.path).second) << "two entries for " << f.path;
  }
}

TEST(KeyFates, ActedOnKeysNameATestThatExists) {
  const auto names = test_names();
  ASSERT_TRUE(names.count("KeyFates.ActedOnKeysNameATestThatExists"));  // the scan works
  for (const auto& f : key_fates()) {
    if (f.fate != Fate::kActedOn) continue;
    EXPECT_TRUE(names.count(f.detail))
        << f.path << " names the test '" << f.detail << "', which is not under tests/";
  }
}

TEST(KeyFates, RefusedKeysAreRefusedByName) {
  for (const auto& f : key_fates()) {
    if (f.fate != Fate::kRefused) continue;
    SCOPED_TRACE(f.path);
    ASSERT_NE(f.example, nullptr);
    try {
      dscpp::parse_ds_config(with_value(f.path, json::parse(f.example)));
      ADD_FAILURE() << f.path << " = " << f.example << " was accepted";
    } catch (const dscpp::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(f.path), std::string::npos) << e.what();
    }
  }
}

TEST(KeyFates, AnnouncedKeysAreAnnouncedOnceAtStartUp) {
  for (const auto& f : key_fates()) {
    if (f.fate != Fate::kAnnounced || f.by_engine) continue;
    SCOPED_TRACE(f.path);
    ASSERT_NE(f.example, nullptr);
    auto c = dscpp::parse_ds_config(with_value(f.path, json::parse(f.example)));
    std::string lines = announcement_of(c.ignored, f.path);
    EXPECT_EQ(std::count(lines.begin(), lines.end(), '\n'), 1) << lines;
    if (f.inert) {  // what dscpp does anyway is not announced
      auto quiet = dscpp::parse_ds_config(with_value(f.path, json::parse(f.inert)));
      EXPECT_EQ(announcement_of(quiet.ignored, f.path), "");
    }
  }
}

TEST(KeyFates, KeysOnceDroppedSilentlyAreAnnounced) {
  json j = {
      {"train_batch_size", 2},
      {"zero_optimization",
       {{"stage", 2},
        {"contiguous_gradients", false},
        {"allgather_bucket_size", 2e8},
        {"load_from_fp32_weights", true},
        {"sub_group_size", 1e9},
        {"ignore_unused_parameters", true}}},
      {"bf16",
       {{"enabled", true}, {"immediate_grad_update", true}, {"bf16_optimizer_states", true}}}};
  auto c = dscpp::parse_ds_config(j);
  for (const char* key :
       {"zero_optimization.contiguous_gradients", "zero_optimization.allgather_bucket_size",
        "zero_optimization.load_from_fp32_weights", "zero_optimization.ignore_unused_parameters",
        "bf16.immediate_grad_update", "bf16.bf16_optimizer_states"})
    EXPECT_NE(announcement_of(c.ignored, key), "") << key;
  // sub_group_size is read since ZeRO-Offload (the CPU optimizer's piece size).
  EXPECT_EQ(announcement_of(c.ignored, "zero_optimization.sub_group_size"), "");
  EXPECT_EQ(c.ignored.size(), 6u);
  // Sections switched off say nothing about their keys; a plain config says nothing at all.
  auto quiet = dscpp::parse_ds_config({{"train_batch_size", 2},
                                       {"wandb", {{"enabled", false}, {"project", "p"}}},
                                       {"zero_optimization", {{"stage", 1}}}});
  EXPECT_TRUE(quiet.ignored.empty()) << quiet.ignored[0];
}

namespace {
std::string refusal(const json& extra) {
  json j = {{"train_batch_size", 1}};
  j.update(extra);
  try {
    dscpp::parse_ds_config(j);
  } catch (const dscpp::ConfigError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(FeatureRefusals, WhatChangesTrainingIsRefusedNotAccepted) {
  json cl = {{"enabled", true},
             {"data_sampling", {{"enabled", true}, {"curriculum_learning", {{"enabled", true}}}}}};
  EXPECT_NE(refusal({{"data_efficiency", cl}}).find("curriculum learning is not supported"),
            std::string::npos);
  json ltd = {{"enabled", true},
              {"data_routing", {{"enabled", true}, {"random_ltd", {{"enabled", true}}}}}};
  EXPECT_NE(refusal({{"data_efficiency", ltd}}).find("random-LTD"), std::string::npos);
  EXPECT_NE(refusal({{"hybrid_engine", {{"enabled", true}}}}).find("hybrid_engine: "),
            std::string::npos);
  EXPECT_NE(refusal({{"weight_quantization", {{"shared_parameters", {{"enabled", true}}}}}})
                .find("weight_quantization: "),
            std::string::npos);
  EXPECT_NE(refusal({{"gradient_allreduce_op", "SUM"}}).find("gradient_allreduce_op: \"sum\""),
            std::string::npos);
  EXPECT_NE(refusal({{"gradient_allreduce_op", "max"}}).find("expected \"mean\" or \"sum\""),
            std::string::npos);
  // Switched off, or at their neutral values, they load.
  cl["enabled"] = false;
  EXPECT_EQ(refusal({{"data_efficiency", cl}}), "");
  EXPECT_EQ(refusal({{"hybrid_engine", {{"enabled", false}}}}), "");
  EXPECT_EQ(refusal({{"gradient_allreduce_op", "mean"}}), "");
  // data_efficiency with only data sampling on (no curriculum): announced, not refused.
  json sampling = {
      {"train_batch_size", 1},
      {"data_efficiency", {{"enabled", true}, {"data_sampling", {{"enabled", true}}}}}};
  auto c = dscpp::parse_ds_config(sampling);
  EXPECT_NE(announcement_of(c.ignored, "data_efficiency"), "");
}
