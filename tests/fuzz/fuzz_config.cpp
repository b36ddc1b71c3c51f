// libFuzzer harness for the config reader: any bytes, as a config file's text, must either
// resolve or raise ConfigError (dscpp::Error); never crash, hang, overflow the stack, leak,
// or let a library exception (nlohmann's) escape. A config that resolves must also print
// (to_json().dump(), what dscpp_report and the checkpoints write), which fails on invalid
// UTF-8, and print again identically from the resolved values.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "dscpp/config/config_error.h"
#include "dscpp/config/ds_config.h"
#include "dscpp/config/json_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  nlohmann::json parsed;
  try {
    parsed = dscpp::config::parse_config_text(text, "<fuzz>");
  } catch (const dscpp::Error&) {
    return 0;
  }
  // Any world size the bytes suggest, so the batch rule's arithmetic is exercised too.
  for (int64_t world : {int64_t{1}, int64_t{3}, int64_t{1} << 40}) {
    dscpp::ConfigOptions options;
    options.world_size = world;
    try {
      dscpp::DSConfig c = dscpp::parse_ds_config(parsed, options);
      const std::string out = dscpp::to_json(c).dump();
      for (const auto& line : c.ignored) (void)nlohmann::json(line).dump();
      for (const auto& line : c.warnings) (void)nlohmann::json(line).dump();
      if (c.train_batch_size !=
          c.train_micro_batch_size_per_gpu * c.gradient_accumulation_steps * world)
        __builtin_trap();  // the batch rule must hold for what it returns
      (void)out;
    } catch (const dscpp::Error&) {
    }
  }
  return 0;
}
