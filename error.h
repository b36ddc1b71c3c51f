// dscpp::Error: the base of every error the library throws, so that a program can catch
// one type. Each layer derives its own (ConfigError, CommError, CheckpointError, ...), which
// say what went wrong and where (the JSON path, the file, the rank).
#pragma once

#include <stdexcept>
#include <string>

namespace dscpp {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace dscpp
