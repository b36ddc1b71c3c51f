// error_text: an exception's message without LibTorch's C++ backtrace, which c10::Error appends
// to what() and which would bury the message that names the problem (and cut it off where a
// test or a launcher keeps only the tail of a rank's output).
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace dscpp::comm {

inline std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return ce->what_without_backtrace();
  return e.what();
}

}  // namespace dscpp::comm
