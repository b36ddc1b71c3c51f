// Reads ds_config text into JSON. DeepSpeed reads configs with an Hjson parser; we accept
// strict JSON plus what real files use of Hjson: `//`, `/* */` and `#` comments, trailing
// commas, a missing root brace, commas left out at line ends, and quoteless keys and
// values. Anything else is a ConfigError that names the line and column.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dscpp::config {

// Parses `text`; `source` names it in errors (a file path, or "<string>").
nlohmann::json parse_config_text(const std::string& text, const std::string& source);

// Reads and parses a file; a missing or unreadable file is a ConfigError.
nlohmann::json read_config_file(const std::string& path);

// A config given as a file path or as JSON text (text starts with '{').
nlohmann::json read_config(const std::string& path_or_text);

}  // namespace dscpp::config
