// libFuzzer harness for model configs written as YAML: any bytes must either read into a
// GPTConfig or raise ConfigError (dscpp::Error); never crash, hang, overflow the stack (nesting,
// aliases), or let yaml-cpp's or nlohmann's exceptions escape. A config that reads must print
// and read back to itself (to_json), and its counts must not trap.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/config/yaml_text.h"
#include "dscpp/model_zoo/gpt_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dscpp::config::KeyPositions positions;
  nlohmann::json parsed;
  try {
    parsed = dscpp::config::parse_yaml_text(text, "<fuzz>", &positions);
    (void)parsed.dump();
  } catch (const dscpp::Error&) {
    return 0;
  }
  try {
    const auto c = dscpp::model_zoo::GPTConfig::from_json(parsed);
    const nlohmann::json out = c.to_json();
    if (dscpp::model_zoo::GPTConfig::from_json(out).to_json() != out) __builtin_trap();
    (void)c.parallelism.resolve(8);
  } catch (const dscpp::Error&) {
  }
  return 0;
}
