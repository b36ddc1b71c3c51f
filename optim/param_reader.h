// Reads an optimizer's or schedule's "params" object the way DeepSpeed's Python constructors
// take keyword arguments: typed values with defaults, and ConfigError (with the key's JSON
// path) for a wrong type, an out-of-range value, or a keyword the constructor does not take.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace dscpp::optim {

class ParamReader {
 public:
  // params: a JSON object (null reads as empty); path: its dotted path, "optimizer.params".
  ParamReader(const nlohmann::json& params, std::string path);

  bool has(const std::string& key) const;       // present and not null
  bool contains(const std::string& key) const;  // present, maybe null (Python's None)
  std::string path_of(const std::string& key) const { return path_ + "." + key; }
  [[noreturn]] void fail(const std::string& key, const std::string& expected) const;

  static constexpr double kInf = std::numeric_limits<double>::infinity();
  double number(const std::string& key, double fallback, double min = -kInf, double max = kInf);
  std::optional<double> optional_number(const std::string& key, double min = -kInf);
  double required_number(const std::string& key, double min = -kInf);
  // An integer (a JSON integer, as DeepSpeed's isinstance(x, int) checks) >= min.
  int64_t integer(const std::string& key, int64_t fallback, int64_t min);
  bool flag(const std::string& key, bool fallback);
  std::string text(const std::string& key, const std::string& fallback);
  // Two coefficients in [0, 1), as torch.optim checks betas.
  std::vector<double> betas(const std::string& key, std::vector<double> fallback);
  // Positive integers; empty when absent.
  std::vector<int64_t> lengths(const std::string& key);
  // A switch for a variant dscpp does not implement: only false (or absent) is accepted.
  void must_be_false(const std::string& key, const std::string& why);
  // Keys the reference accepts that change nothing here (kernel choice, memory layout).
  void tolerate(std::initializer_list<const char*> keys);

  // Throws for the first key no getter read: the Python constructor's TypeError.
  void finish() const;

 private:
  const nlohmann::json* get(const std::string& key);
  nlohmann::json params_;
  std::string path_;
  std::set<std::string> read_;
};

}  // namespace dscpp::optim
