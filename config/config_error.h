// The error every config problem raises: it carries the JSON path of the offending key
// (`zero_optimization.stage`), so a user can find the line to fix.
#pragma once

#include <stdexcept>
#include <string>

#include "dscpp/error.h"

namespace dscpp {

class ConfigError : public Error {
 public:
  ConfigError(std::string path, const std::string& message)
      : Error(path.empty() ? message : path + ": " + message), path_(std::move(path)) {}
  const std::string& path() const { return path_; }

 private:
  std::string path_;  // dotted JSON path; empty for whole-file problems
};

}  // namespace dscpp
