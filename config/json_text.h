// Reads ds_config text into JSON. DeepSpeed reads configs with an Hjson parser; we accept
// strict JSON plus what real files use of Hjson: `//`, `/* */` and `#` comments, trailing
// commas, a missing root brace, commas left out at line ends, and quoteless keys and
// values. Anything else is a ConfigError that names the line and column.
#pragma once

#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>

namespace dscpp::config {

// Parses `text`; `source` names it in errors (a file path, or "<string>").
nlohmann::json parse_config_text(const std::string& text, const std::string& source);

// Where a key is written in a config file (1-based), by the key's dotted JSON path
// ("model.hidden_size", "layers[2].name"). Only the YAML reader fills it today.
struct TextPosition {
  int line = 0;
  int column = 0;
};
using KeyPositions = std::map<std::string, TextPosition>;

// Reads and parses a file; a missing or unreadable file is a ConfigError. A file named
// *.yaml or *.yml is read as YAML (yaml_text.h), anything else as JSON / Hjson; `positions`
// (optional) receives the keys' line:column where the reader knows them.
nlohmann::json read_config_file(const std::string& path, KeyPositions* positions = nullptr);

// "FILE:LINE:COLUMN" of the key at `path` (or of its closest enclosing key), or just FILE when
// `positions` holds none of them: for errors found after parsing.
std::string where_in_file(const std::string& file, const KeyPositions& positions,
                          const std::string& path);

// A config given as a file path or as JSON text (text starts with '{').
nlohmann::json read_config(const std::string& path_or_text);

}  // namespace dscpp::config
