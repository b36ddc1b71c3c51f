// YAML config text: the core schema's scalar types, quoted strings, nesting, the keys'
// positions, and errors that name the file, line and column.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_text.h"
#include "dscpp/config/yaml_text.h"

using dscpp::ConfigError;
using dscpp::config::KeyPositions;
using dscpp::config::parse_yaml_text;

namespace {

std::string yaml_error_of(const std::string& text) {
  try {
    parse_yaml_text(text, "m.yaml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(YamlText, PlainScalarsTakeCoreSchemaTypes) {
  auto j = parse_yaml_text(
      "int: 2048\nneg: -3\nhex: 0x10\noct: 0o17\nexp: 1e-5\nfloat: 0.02\nyes: true\n"
      "dot: .5\nsigned: +7\nalmost: 1e\nversion: 1.2.3\n"
      "no: False\nnothing: ~\nempty:\nword: tanh\n",
      "t");
  EXPECT_TRUE(j["int"].is_number_integer());
  EXPECT_EQ(j["int"], 2048);
  EXPECT_EQ(j["neg"], -3);
  EXPECT_EQ(j["hex"], 16);
  EXPECT_EQ(j["oct"], 15);
  // PyYAML (YAML 1.1) reads 1e-5 as a string; YAML 1.2, and we, as a float.
  EXPECT_TRUE(j["exp"].is_number_float());
  EXPECT_DOUBLE_EQ(j["exp"].get<double>(), 1e-5);
  EXPECT_DOUBLE_EQ(j["float"].get<double>(), 0.02);
  EXPECT_EQ(j["yes"], true);
  EXPECT_EQ(j["no"], false);
  EXPECT_TRUE(j["nothing"].is_null());
  EXPECT_TRUE(j["empty"].is_null());
  EXPECT_EQ(j["word"], "tanh");
  EXPECT_DOUBLE_EQ(j["dot"].get<double>(), 0.5);
  EXPECT_EQ(j["signed"], 7);
  EXPECT_EQ(j["almost"], "1e");
  EXPECT_EQ(j["version"], "1.2.3");
}

TEST(YamlText, QuotedAndTaggedScalarsKeepTheirType) {
  auto j = parse_yaml_text("a: '2048'\nb: \"true\"\nc: !!str 7\nd: !!float 3\n", "t");
  EXPECT_EQ(j["a"], "2048");
  EXPECT_EQ(j["b"], "true");
  EXPECT_EQ(j["c"], "7");
  EXPECT_TRUE(j["d"].is_number_float());
  EXPECT_DOUBLE_EQ(j["d"].get<double>(), 3.0);
}

TEST(YamlText, SectionsListsAndFlowStyleNest) {
  auto j = parse_yaml_text(
      "model:\n  hidden_size: 64   # a comment\n  betas: [0.9, 0.95]\n"
      "parallelism: {tensor_model_parallel_size: 2}\nlist:\n  - 1\n  - x\n",
      "t");
  EXPECT_EQ(j["model"]["hidden_size"], 64);
  EXPECT_DOUBLE_EQ(j["model"]["betas"][1].get<double>(), 0.95);
  EXPECT_EQ(j["parallelism"]["tensor_model_parallel_size"], 2);
  EXPECT_EQ(j["list"], nlohmann::json({1, "x"}));
}

TEST(YamlText, PositionsOfEveryKeyAreRecorded) {
  KeyPositions pos;
  parse_yaml_text("model:\n  hidden_size: 64\n  heads: [1, {k: 2}]\n", "t", &pos);
  EXPECT_EQ(pos.at("model").line, 1);
  EXPECT_EQ(pos.at("model").column, 1);
  EXPECT_EQ(pos.at("model.hidden_size").line, 2);
  EXPECT_EQ(pos.at("model.hidden_size").column, 3);
  EXPECT_EQ(pos.at("model.heads[1].k").line, 3);
  // A later error on a value points at its key, or at the closest key above it.
  EXPECT_EQ(dscpp::config::where_in_file("f.yaml", pos, "model.hidden_size"), "f.yaml:2:3");
  EXPECT_EQ(dscpp::config::where_in_file("f.yaml", pos, "model.heads[0]"), "f.yaml:3:3");
  EXPECT_EQ(dscpp::config::where_in_file("f.yaml", pos, "other"), "f.yaml");
}

TEST(YamlText, ErrorsNameFileLineAndColumn) {
  std::string e = yaml_error_of("model:\n  hidden_size: [1, 2\n  num_layers: 2\n");
  EXPECT_NE(e.find("m.yaml:"), std::string::npos) << e;
  EXPECT_NE(e.find("cannot parse"), std::string::npos) << e;
  e = yaml_error_of("model:\n  hidden_size: 64\n  hidden_size: 128\n");
  EXPECT_NE(e.find("m.yaml:3:3"), std::string::npos) << e;
  EXPECT_NE(e.find("duplicate key \"hidden_size\""), std::string::npos) << e;
  e = yaml_error_of("a: 1\n---\nb: 2\n");
  EXPECT_NE(e.find("m.yaml:2:1"), std::string::npos) << e;
  EXPECT_NE(e.find("second YAML document"), std::string::npos) << e;
  // yaml-cpp 0.7's LoadAll loops forever on these (jbeder/yaml-cpp#1040): an error, at once.
  for (const char* stray : {",", ", a\n", "- 1\n,\n"}) {
    e = yaml_error_of(stray);
    EXPECT_NE(e.find("stray ','"), std::string::npos) << stray << ": " << e;
  }
  e = yaml_error_of("? [1, 2]\n: x\n");
  EXPECT_NE(e.find("m.yaml:1:"), std::string::npos) << e;
  EXPECT_NE(e.find("key must be a plain name"), std::string::npos) << e;
  e = yaml_error_of("a: !!int x\n");
  EXPECT_NE(e.find("m.yaml:1:4"), std::string::npos) << e;
  EXPECT_NE(e.find("not a valid !!int"), std::string::npos) << e;
  e = yaml_error_of("a:\n  b: -.inf\n");
  EXPECT_NE(e.find("m.yaml:2:6"), std::string::npos) << e;
  EXPECT_NE(e.find("'-.inf' is not a finite number"), std::string::npos) << e;
  EXPECT_NE(yaml_error_of("a: 1e999\n").find("not a finite number"), std::string::npos);
  // Numbers beyond int64 or a double: a double, text, or the error; never a crash.
  auto big = parse_yaml_text("a: 99999999999999999999\nb: 0xffffffffffffffffff\n", "t");
  EXPECT_DOUBLE_EQ(big["a"].get<double>(), 1e20);
  EXPECT_EQ(big["b"], "0xffffffffffffffffff");
  EXPECT_NE(yaml_error_of("a: " + std::string(100000, '9') + "\n").find("not a finite number"),
            std::string::npos);
  // NUL bytes (yaml-cpp would read them as UTF-16 or UTF-32) and escapes that spell no
  // UTF-8 (a lone surrogate) are refused before anything prints them.
  e = yaml_error_of(std::string("\x01\0\0\0a: 1\n", 9));
  EXPECT_NE(e.find("NUL byte at offset 1"), std::string::npos) << e;
  e = yaml_error_of("a: \"\\ud800\"\n");
  EXPECT_NE(e.find("m.yaml"), std::string::npos) << e;
  EXPECT_EQ(e.find("(no error)"), std::string::npos) << e;
  e = yaml_error_of("# only a comment\n");
  EXPECT_NE(e.find("no configuration"), std::string::npos) << e;
}

TEST(YamlText, AliasBombsAndDeepNestingAreRefused) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  char prev = 'a';
  for (char c = 'b'; c <= 'j'; ++c) {
    bomb += fmt::format("{0}: &{0} [*{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}, *{1}]\n",
                        c, prev);
    prev = c;
  }
  EXPECT_NE(yaml_error_of(bomb).find("aliases expanding"), std::string::npos)
      << yaml_error_of(bomb);
  std::string deep = "a: " + std::string(150, '[') + std::string(150, ']') + "\n";
  EXPECT_NE(yaml_error_of(deep).find("nested more than"), std::string::npos) << yaml_error_of(deep);
}

TEST(YamlText, ReadConfigFileReadsYamlByItsExtension) {
  auto dir = std::filesystem::temp_directory_path() / "dscpp_yaml_text_test";
  std::filesystem::create_directories(dir);
  for (const char* name : {"c.yaml", "c.YML"}) {
    std::ofstream(dir / name) << "train_batch_size: 8\nfp16:\n  enabled: true\n";
    auto j = dscpp::config::read_config_file((dir / name).string());
    EXPECT_EQ(j["train_batch_size"], 8) << name;
    EXPECT_EQ(j["fp16"]["enabled"], true) << name;
  }
  EXPECT_TRUE(dscpp::config::is_yaml_path("a/b.yml"));
  EXPECT_FALSE(dscpp::config::is_yaml_path("a.yaml/b.json"));
  EXPECT_FALSE(dscpp::config::is_yaml_path("ds.json"));
  std::filesystem::remove_all(dir);
}
