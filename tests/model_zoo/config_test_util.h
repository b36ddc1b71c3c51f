// What the model-config tests (test_model_configs.cpp, test_moe_configs.cpp) share: the shipped
// configs' paths and the message of a ConfigError.
#pragma once

#include <functional>
#include <string>

#include "dscpp/config/config_error.h"

namespace model_config_test {

// A config of model_zoo/configs.
inline std::string shipped(const std::string& name) {
  return std::string(DSCPP_MODEL_ZOO_CONFIGS) + "/" + name;
}

// The message of the ConfigError `f` throws ("(no error)" when it throws none).
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dscpp::ConfigError& e) {
    return e.what();
  }
  return "(no error)";
}

inline bool has(const std::string& message, const std::string& part) {
  return message.find(part) != std::string::npos;
}

}  // namespace model_config_test
