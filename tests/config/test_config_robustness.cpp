// Malformed and hostile config text: every problem is a ConfigError (a
// dscpp::Error) naming the file and the position or JSON path; none aborts, overflows the
// stack, or lets a library exception (nlohmann's) escape.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/config/json_bounds.h"
#include "dscpp/config/json_text.h"
#include "dscpp/model_zoo/gpt_config.h"

using dscpp::config::parse_config_text;
using nlohmann::json;

namespace {

// The message of the dscpp::Error the text raises, or "" when it parses. Any other
// exception fails the test by escaping.
std::string text_error(const std::string& text) {
  try {
    parse_config_text(text, "cfg.json");
  } catch (const dscpp::Error& e) {
    EXPECT_NE(dynamic_cast<const dscpp::ConfigError*>(&e), nullptr);
    return e.what();
  }
  return "";
}

std::string config_error(const json& j, int64_t world = 1) {
  dscpp::ConfigOptions o;
  o.world_size = world;
  try {
    dscpp::parse_ds_config(j, o);
  } catch (const dscpp::Error& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST(ConfigRobustness, NumbersBeyondADoubleNameTheNumberAndPosition) {
  // Strict JSON, Hjson, nested, negative, and as an array element.
  for (const char* t : {R"({"train_batch_size": 1e400})", R"({"a": {"b": -1e999}})",
                        "train_batch_size: 1e400\n", R"({"a": [1, 2e308]})"}) {
    SCOPED_TRACE(t);
    std::string e = text_error(t);
    EXPECT_TRUE(has(e, "cfg.json:1:") || has(e, "cfg.json:2:")) << e;
    EXPECT_TRUE(has(e, "out of range")) << e;
  }
  // The largest double still reads.
  EXPECT_EQ(text_error(R"({"a": 1.7e308})"), "");
}

TEST(ConfigRobustness, InvalidUtf8IsRefusedWhereverItIs) {
  const std::string bad = "\xff";
  for (const std::string& t :
       {std::string("{\"a\": x") + bad + "y}", "{\"a\": \"x" + bad + "\"}", "a: v" + bad + "\n",
        "{\"k" + bad + "\": 1}", "{\"a\": 1 // " + bad + "\n}",
        std::string("{\"a\": \"\xc0\xaf\"}"), std::string("{\"a\": \"\xed\xa0\x80\"}"),
        std::string("{\"a\": \"\xe2\x82\"}")}) {
    SCOPED_TRACE(t);
    std::string e = text_error(t);
    EXPECT_TRUE(has(e, "cfg.json:1:")) << e;
    EXPECT_TRUE(has(e, "not valid UTF-8")) << e;
  }
  // Well-formed multi-byte text reads, and survives dump().
  json ok =
      parse_config_text("{\"job\": \"J\xc3\xa9r\xc3\xb4me \xe2\x82\xac \xf0\x9f\x98\x80\"}", "t");
  EXPECT_EQ(ok.dump(), "{\"job\":\"J\xc3\xa9r\xc3\xb4me \xe2\x82\xac \xf0\x9f\x98\x80\"}");
  // A program's JSON with a bad string: refused by path before anything prints it (the
  // checkpoints record the config, and torch.load refuses invalid UTF-8).
  json j = {{"train_batch_size", 1}, {"tensorboard", {{"job_name", "x" + bad}}}};
  std::string e = config_error(j);
  EXPECT_TRUE(has(e, "tensorboard.job_name: the string is not valid UTF-8")) << e;
}

// A value the reader cannot take is named by its JSON path as well as its line and column:
// the three a user met (a number beyond a double, a string that is not UTF-8, NaN), then the
// same in other places (nested, in an array, quoteless, Hjson without braces, YAML).
TEST(ConfigRobustness, ABadValueIsNamedByItsJsonPath) {
  const std::string range = " is out of range (a number beyond a double's 1.8e308)";
  const std::string utf8 = ": byte 0xff is not valid UTF-8 (a config must be UTF-8 text)";
  const std::string nan = " is not a JSON number: write a finite number";
  // Columns counted by hand: the value's first byte, or the bad byte itself.
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"train_batch_size": 1e400})",
       "cfg.json:1:22: cannot parse: train_batch_size: 1e400" + range},
      {"{\"flops_profiler\": {\"output_file\": out\xff.txt}}",
       "cfg.json:1:39: cannot parse: flops_profiler.output_file" + utf8},
      {"{\"flops_profiler\": {\"output_file\": \"out\xff.txt\"}}",
       "cfg.json:1:40: cannot parse: flops_profiler.output_file" + utf8},
      {R"({"gradient_clipping": NaN})",
       "cfg.json:1:23: cannot parse: gradient_clipping: NaN" + nan},
      {"{\n  \"a\": {\"b\": [1, {\"c\": -1e999}]}\n}",
       "cfg.json:2:24: cannot parse: a.b[1].c: -1e999" + range},
      {R"({"a": [0, [1, -Infinity]]})", "cfg.json:1:15: cannot parse: a[1][1]: -Infinity" + nan},
      {"zero_optimization: {\n  stage: 2\n  reduce_bucket_size: 5e500\n}\n",
       "cfg.json:3:23: cannot parse: zero_optimization.reduce_bucket_size: 5e500" + range},
      {"tensorboard: {\n  job_name: run\xff\n}\n",
       "cfg.json:2:16: cannot parse: tensorboard.job_name" + utf8},
  };
  for (const auto& [text, expected] : cases) {
    SCOPED_TRACE(text);
    EXPECT_EQ(text_error(text), expected);
  }
  // In a key, the object that holds it; in a comment, no path but the position.
  EXPECT_EQ(text_error("{\"zero_optimization\": {\"st\xff\": 1}}"),
            "cfg.json:1:27: cannot parse: a key in zero_optimization" + utf8);
  EXPECT_EQ(text_error("{\"a\": 1 // caf\xff\n}"), "cfg.json:1:15: cannot parse" + utf8);
  // YAML names the path the same way.
  namespace fs = std::filesystem;
  const fs::path yaml = fs::temp_directory_path() / "dscpp_bad_value.yaml";
  std::ofstream(yaml) << "optimizer:\n  params:\n    lr: .nan\n";
  try {
    dscpp::config::read_config_file(yaml.string());
    ADD_FAILURE() << "a NaN read from YAML";
  } catch (const dscpp::ConfigError& e) {
    EXPECT_EQ(
        std::string(e.what()),
        yaml.string() + ":3:9: cannot parse: optimizer.params.lr: '.nan' is not a finite number");
  }
  fs::remove(yaml);
}

TEST(ConfigRobustness, DeepNestingIsBoundedNotAStackOverflow) {
  const int n = 20000;
  for (const std::string& open : {std::string("["), std::string("{\"a\":"), std::string("a: {")}) {
    std::string t;
    for (int i = 0; i < n; ++i) t += open;
    SCOPED_TRACE(open);
    std::string e = text_error(t);
    EXPECT_TRUE(has(e, "nested more than 100 deep")) << e.substr(0, 200);
    EXPECT_TRUE(has(e, "cfg.json:1:")) << e.substr(0, 200);
  }
  // Exactly at the bound it reads; one deeper it does not.
  auto nest = [](int d) { return std::string(d, '[') + std::string(d, ']'); };
  EXPECT_EQ(text_error(nest(dscpp::config::kMaxConfigDepth)), "");
  EXPECT_NE(text_error(nest(dscpp::config::kMaxConfigDepth + 1)), "");
  // A program's JSON nested as deep: refused before any recursive copy.
  json deep = {{"train_batch_size", 1}};
  json* p = &deep;
  for (int i = 0; i < n; ++i) p = &((*p)["x"] = json::object());
  std::string e = config_error(deep);
  EXPECT_TRUE(has(e, "nested more than 100 deep")) << e.substr(0, 200);
}

TEST(ConfigRobustness, NanAndInfinitySayWhatIsWrong) {
  for (const char* t : {R"({"optimizer": {"params": {"lr": NaN}}})", R"({"a": Infinity})",
                        R"({"a": -inf})", "a: nan\n"}) {
    SCOPED_TRACE(t);
    std::string e = text_error(t);
    EXPECT_TRUE(has(e, "is not a JSON number")) << e;
    EXPECT_FALSE(has(e, "missing")) << e;
  }
}

TEST(ConfigRobustness, AQuotelessValueThatTakesTheBraceIsNamed) {
  std::string e = text_error(R"({"lr": fast})");
  EXPECT_TRUE(has(e, "missing '}'")) << e;
  EXPECT_TRUE(has(e, "quoteless value at 1:8")) << e;
}

TEST(ConfigRobustness, FoldersEmptyTextAndOversizeTextAreNamed) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / "dscpp_config_robustness";
  fs::create_directories(dir);
  try {
    dscpp::load_ds_config(dir.string());
    ADD_FAILURE() << "a folder loaded";
  } catch (const dscpp::ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "is a folder, not a config file")) << e.what();
  }
  fs::path empty = dir / "empty.json";
  std::ofstream(empty) << "  // nothing\n";
  try {
    dscpp::load_ds_config(empty.string());
    ADD_FAILURE() << "an empty file loaded";
  } catch (const dscpp::ConfigError& e) {
    EXPECT_TRUE(has(e.what(), "no configuration in it")) << e.what();
  }
  fs::remove_all(dir);
  std::string big = "{\"a\": \"" + std::string(dscpp::config::kMaxConfigBytes, 'x') + "\"}";
  EXPECT_TRUE(has(text_error(big), "more than a config may hold")) << text_error(big);
}

TEST(BatchSize, ProductsBeyondInt64AreRefusedNotWrapped) {
  // 2^62 * 4 * 2 used to wrap to 0 and resolve.
  const int64_t big = int64_t{1} << 62;
  for (const json& j :
       {json{{"train_micro_batch_size_per_gpu", big}, {"gradient_accumulation_steps", 4}},
        json{{"train_micro_batch_size_per_gpu", big}},
        json{{"train_batch_size", 8},
             {"train_micro_batch_size_per_gpu", big},
             {"gradient_accumulation_steps", 4}}}) {
    SCOPED_TRACE(j.dump());
    std::string e = config_error(j, 2);
    EXPECT_TRUE(has(e, "beyond a 64-bit integer")) << e;
  }
  // The world size alone can carry it over.
  std::string e = config_error({{"train_micro_batch_size_per_gpu", 3}}, int64_t{1} << 62);
  EXPECT_TRUE(has(e, "beyond a 64-bit integer")) << e;
  // Just inside: 2^61 * 2 * 2 = 2^63 overflows; 2^60 * 2 * 2 = 2^62 does not.
  dscpp::ConfigOptions o;
  o.world_size = 2;
  auto c = dscpp::parse_ds_config(
      {{"train_micro_batch_size_per_gpu", int64_t{1} << 60}, {"gradient_accumulation_steps", 2}},
      o);
  EXPECT_EQ(c.train_batch_size, int64_t{1} << 62);
}

TEST(ConfigRobustness, TheModelConfigReaderHasTheSameBounds) {
  // model_zoo's GPT config reads its file through config/: the same errors, naming the file.
  namespace fs = std::filesystem;
  const std::string path = (fs::temp_directory_path() / "dscpp_bad_gpt_config.json").string();
  const std::string bad = "\xfe";
  for (const std::string& text :
       {std::string(R"({"hidden_size": 1e400})"), std::string(5000, '[') + std::string(5000, ']'),
        "{\"hidden_size\": x" + bad + "}"}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
    try {
      dscpp::model_zoo::GPTConfig::from_file(path);
      ADD_FAILURE() << "read: " << text.substr(0, 40);
    } catch (const dscpp::ConfigError& e) {
      EXPECT_TRUE(has(e.what(), path + ":1:")) << e.what();
    }
  }
  fs::remove(path);
  json deep = json::object();
  json* p = &deep;
  for (int i = 0; i < 5000; ++i) p = &((*p)["x"] = json::object());
  EXPECT_THROW(dscpp::model_zoo::GPTConfig::from_json(deep), dscpp::ConfigError);
}
