// ParamReader: typed access to a params object, with the JSON path in every error.
#include "dscpp/optim/param_reader.h"

#include <fmt/format.h>

#include <cmath>

#include "dscpp/config/config_error.h"

namespace dscpp::optim {

using nlohmann::json;

ParamReader::ParamReader(const json& params, std::string path)
    : params_(params.is_null() ? json::object() : params), path_(std::move(path)) {
  if (!params_.is_object()) throw ConfigError(path_, "expected an object of parameters");
}

bool ParamReader::has(const std::string& key) const {
  auto it = params_.find(key);
  return it != params_.end() && !it->is_null();
}

bool ParamReader::contains(const std::string& key) const {
  return params_.contains(key);
}

void ParamReader::fail(const std::string& key, const std::string& expected) const {
  auto it = params_.find(key);
  std::string got = it == params_.end() ? "nothing" : it->dump();
  throw ConfigError(path_of(key), fmt::format("expected {}, got {}", expected, got));
}

const json* ParamReader::get(const std::string& key) {
  read_.insert(key);
  auto it = params_.find(key);
  return it == params_.end() || it->is_null() ? nullptr : &*it;
}

namespace {
std::string range_text(double min, double max) {
  if (min == -ParamReader::kInf && max == ParamReader::kInf) return "a number";
  if (max == ParamReader::kInf) return fmt::format("a number >= {}", min);
  return fmt::format("a number in [{}, {})", min, max);
}
}  // namespace

double ParamReader::number(const std::string& key, double fallback, double min, double max) {
  const json* v = get(key);
  if (!v) return fallback;
  // A list would be DeepSpeed's per-param-group form; dscpp's groups are shards.
  if (v->is_array()) fail(key, range_text(min, max) + " (per-group lists are not supported)");
  if (!v->is_number()) fail(key, range_text(min, max));
  double x = v->get<double>();
  if (!(x >= min) || (max != kInf && !(x < max)) || std::isnan(x)) fail(key, range_text(min, max));
  return x;
}

std::optional<double> ParamReader::optional_number(const std::string& key, double min) {
  if (!has(key)) {
    read_.insert(key);
    return std::nullopt;
  }
  return number(key, 0, min);
}

double ParamReader::required_number(const std::string& key, double min) {
  if (!has(key)) fail(key, range_text(min, kInf) + " (required)");
  return number(key, 0, min);
}

int64_t ParamReader::integer(const std::string& key, int64_t fallback, int64_t min) {
  const json* v = get(key);
  if (!v) return fallback;
  if (!v->is_number_integer() || v->get<int64_t>() < min)
    fail(key, fmt::format("an integer >= {}", min));
  return v->get<int64_t>();
}

bool ParamReader::flag(const std::string& key, bool fallback) {
  const json* v = get(key);
  if (!v) return fallback;
  if (!v->is_boolean()) fail(key, "true or false");
  return v->get<bool>();
}

std::string ParamReader::text(const std::string& key, const std::string& fallback) {
  const json* v = get(key);
  if (!v) return fallback;
  if (!v->is_string()) fail(key, "a string");
  return v->get<std::string>();
}

std::vector<double> ParamReader::betas(const std::string& key, std::vector<double> fallback) {
  const json* v = get(key);
  if (!v) return fallback;
  const char* expected = "two numbers in [0, 1)";
  if (!v->is_array() || v->size() != 2) fail(key, expected);
  std::vector<double> out;
  for (const json& b : *v) {
    if (!b.is_number() || !(b.get<double>() >= 0 && b.get<double>() < 1)) fail(key, expected);
    out.push_back(b.get<double>());
  }
  return out;
}

std::vector<int64_t> ParamReader::lengths(const std::string& key) {
  const json* v = get(key);
  if (!v) return {};
  const char* expected = "a list of integers >= 0";
  if (!v->is_array()) fail(key, expected);
  std::vector<int64_t> out;
  for (const json& n : *v) {
    if (!n.is_number_integer() || n.get<int64_t>() < 0) fail(key, expected);
    out.push_back(n.get<int64_t>());
  }
  return out;
}

void ParamReader::must_be_false(const std::string& key, const std::string& why) {
  const json* v = get(key);
  if (v && !(v->is_boolean() && !v->get<bool>())) fail(key, "false (" + why + ")");
}

void ParamReader::tolerate(std::initializer_list<const char*> keys) {
  for (const char* k : keys) read_.insert(k);
}

void ParamReader::finish() const {
  for (const auto& [key, value] : params_.items()) {
    if (read_.count(key)) continue;
    std::string known;
    for (const auto& k : read_) known += (known.empty() ? "" : ", ") + k;
    throw ConfigError(path_of(key), fmt::format("unknown parameter; expected one of {}", known));
  }
}

}  // namespace dscpp::optim
