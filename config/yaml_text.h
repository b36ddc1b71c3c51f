// Reads YAML config text (model configs such as the seed's 1.3B_demo.yaml) into JSON, through
// Debian's yaml-cpp. Plain scalars take YAML 1.2's core-schema types (null, true/false, integers
// in decimal, 0x and 0o, floats with an exponent such as 1e-5 included, .inf, .nan); quoted
// scalars stay strings; explicit !!str / !!int / !!float / !!bool / !!null tags are obeyed.
// A syntax error, a duplicate key, a key that is not a string, a second document, or a tag we do
// not know is a ConfigError naming the file, line and column (1-based). Where `positions` is
// given it receives the line:column of every key, by JSON path, so that a later error on a value
// (`model.hidden_size: expected ...`) can point at the line too.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "dscpp/config/json_text.h"

namespace dscpp::config {

// `source` names the text in errors (a file path, or "<string>").
nlohmann::json parse_yaml_text(const std::string& text, const std::string& source,
                               KeyPositions* positions = nullptr);

// Whether `path` names a YAML file (.yaml or .yml, any case).
bool is_yaml_path(const std::string& path);

}  // namespace dscpp::config
