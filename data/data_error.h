// DataError: what the data readers throw. It names the file and, where one applies, the
// position in it ("byte 42", "line 3, column 7", "document 12, token 5"), so that a user can
// find the bad input: "<file>: <position>: <problem>".
#pragma once

#include <string>

#include "dscpp/error.h"

namespace dscpp::data {

class DataError : public dscpp::Error {
 public:
  DataError(std::string file, std::string position, const std::string& problem)
      : Error(file + ": " + (position.empty() ? "" : position + ": ") + problem),
        file_(std::move(file)),
        position_(std::move(position)) {}
  DataError(std::string file, const std::string& problem)
      : DataError(std::move(file), "", problem) {}

  const std::string& file() const { return file_; }
  const std::string& position() const { return position_; }  // "" when the whole file is meant

 private:
  std::string file_;
  std::string position_;
};

}  // namespace dscpp::data
