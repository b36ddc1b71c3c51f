// Text functions that the launcher's readers of files and environments share.
#pragma once

#include <string>

namespace dscpp::launcher {

// `s` without its leading and trailing whitespace (space, tab, CR, LF, VT, FF).
inline std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace dscpp::launcher
