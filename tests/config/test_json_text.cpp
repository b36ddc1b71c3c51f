// Config text: strict JSON, comments, the Hjson relaxations real configs use, and errors
// that name the line and column.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "dscpp/config/config_error.h"
#include "dscpp/config/json_text.h"

using dscpp::ConfigError;
using dscpp::config::parse_config_text;

TEST(JsonText, StrictJsonReadsAsIs) {
  auto j = parse_config_text(R"({"a": 1, "b": [true, null], "c": {"d": "x"}})", "t");
  EXPECT_EQ(j["a"], 1);
  EXPECT_EQ(j["b"][0], true);
  EXPECT_TRUE(j["b"][1].is_null());
  EXPECT_EQ(j["c"]["d"], "x");
}

TEST(JsonText, CommentsOfBothKindsAreSkipped) {
  auto j = parse_config_text("{\n // line\n \"a\": 1, /* block */ \"b\": 2\n}", "t");
  EXPECT_EQ(j["a"], 1);
  EXPECT_EQ(j["b"], 2);
}

TEST(JsonText, ExponentIntegersStayNumbers) {
  auto j = parse_config_text(R"({"reduce_bucket_size": 5e8})", "t");
  EXPECT_DOUBLE_EQ(j["reduce_bucket_size"].get<double>(), 5e8);
}

TEST(JsonText, HjsonWithoutRootBracesCommasOrQuotes) {
  auto j = parse_config_text(
      "# hash comment\n"
      "train_batch_size: 8\n"
      "\"fp16\": {\n  enabled: true // no comma here\n  loss_scale: 0\n}\n"
      "name: some words here\n",
      "t");
  EXPECT_EQ(j["train_batch_size"], 8);
  EXPECT_EQ(j["fp16"]["enabled"], true);
  EXPECT_EQ(j["fp16"]["loss_scale"], 0);
  EXPECT_EQ(j["name"], "some words here");
}

TEST(JsonText, TrailingCommasAndSingleQuotes) {
  auto j = parse_config_text("{'a': 'x', \"b\": [1, 2,],}", "t");
  EXPECT_EQ(j["a"], "x");
  EXPECT_EQ(j["b"].size(), 2u);
}

TEST(JsonText, QuotelessValueRunsToEndOfLineLikeHjson) {
  // A sed template placeholder: Hjson (and so DeepSpeed) reads "GBSIZE," as a string.
  auto j = parse_config_text("{\n \"train_batch_size\": GBSIZE,\n \"x\": 1\n}", "t");
  EXPECT_EQ(j["train_batch_size"], "GBSIZE,");
  EXPECT_EQ(j["x"], 1);
}

TEST(JsonText, DuplicateKeysAreRefusedAsDeepSpeedDoes) {
  try {
    parse_config_text(R"({"a": 1, "a": 2})", "cfg.json");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key \"a\""), std::string::npos) << e.what();
  }
}

TEST(JsonText, ErrorsNameLineAndColumn) {
  try {
    parse_config_text("{\n  \"a\": 1\n}\n```\n", "cfg.json");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cfg.json:4:1"), std::string::npos) << e.what();
  }
  try {
    parse_config_text("{\n  \"a\": {\n    \"b\": 1\n", "cfg.json");
    FAIL() << "expected an error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("missing '}'"), std::string::npos) << e.what();
  }
}

TEST(JsonText, MissingFileIsAClearError) {
  EXPECT_THROW(dscpp::config::read_config_file("/nonexistent/ds.json"), ConfigError);
}
