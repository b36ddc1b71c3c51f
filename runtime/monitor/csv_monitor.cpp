// DeepSpeed's CSV monitor: one appended CSV file per event name.
#include "dscpp/runtime/monitor/csv_monitor.h"

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "dscpp/error.h"

namespace dscpp::monitor {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw dscpp::Error("dscpp csv_monitor: " + what + " '" + path + "': " + std::strerror(err));
}

void put(std::FILE* f, const std::string& text, const std::string& path) {
  if (std::fwrite(text.data(), 1, text.size(), f) != text.size()) fail(path, "cannot write", errno);
}

}  // namespace

std::string python_float_repr(double v) {
  if (std::isnan(v)) return "nan";  // Python drops NaN's sign
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  // The shortest round-trip digits as d.ddde±x; Python picks the same digits (both are
  // the shortest string that reads back to v, nearest to v among those).
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const size_t e = sci.find('e');
  std::string digits;
  bool negative = false;
  for (size_t i = 0; i < e; ++i) {
    if (sci[i] == '-') negative = true;
    if (sci[i] >= '0' && sci[i] <= '9') digits.push_back(sci[i]);
  }
  const int exponent = std::stoi(sci.substr(e + 1));
  const int point = exponent + 1;  // digits before the decimal point, positional
  const int n = static_cast<int>(digits.size());

  std::string out = negative ? "-" : "";
  if (point <= -4 || point > 16) {  // Python's float_repr_style 'short' switch points
    out += digits[0];
    if (n > 1) out += "." + digits.substr(1);
    const int a = std::abs(exponent);
    out += exponent < 0 ? "e-" : "e+";
    if (a < 10) out += '0';
    out += std::to_string(a);
  } else if (point <= 0) {
    out += "0." + std::string(-point, '0') + digits;
  } else if (point >= n) {
    out += digits + std::string(point - n, '0') + ".0";
  } else {
    out += digits.substr(0, point) + "." + digits.substr(point);
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

CsvMonitor::CsvMonitor(const std::string& log_dir) : log_dir_(log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
  if (ec)
    throw dscpp::Error("dscpp csv_monitor: cannot create folder '" + log_dir_ +
                       "': " + ec.message());
}

CsvMonitor::~CsvMonitor() {
  for (auto& [name, f] : files_) std::fclose(f);
}

std::string CsvMonitor::file_for(const std::string& event_name) const {
  std::string name = event_name;
  for (char& c : name)
    if (c == '/' || c == ' ') c = '_';
  return log_dir_ + "/" + name + ".csv";  // DeepSpeed's own concatenation, not os.path.join
}

CsvMonitor::OpenFile& CsvMonitor::open_for(const std::string& event_name) {
  const std::string path = file_for(event_name);
  auto it = files_.find(path);
  if (it != files_.end()) return *it;
  // Appends, as DeepSpeed's open(fname, 'a+'): a resumed run adds to the old rows, after a
  // header row of its own.
  std::FILE* f = std::fopen(path.c_str(), "ab");
  if (!f) fail(path, "cannot open", errno);
  OpenFile& entry = *files_.emplace(path, f).first;
  const size_t slash = event_name.rfind('/');
  const std::string header = slash == std::string::npos ? event_name : event_name.substr(slash + 1);
  put(f, "step," + csv_field(header) + "\r\n", path);
  return entry;
}

void CsvMonitor::write_events(const std::vector<Event>& events) {
  for (const Event& event : events) {
    auto& [path, f] = open_for(event.name);
    put(f, std::to_string(event.step) + "," + python_float_repr(event.value) + "\r\n", path);
  }
  flush();
}

void CsvMonitor::flush() {
  for (auto& [path, f] : files_)
    if (std::fflush(f) != 0) fail(path, "cannot write", errno);
}

}  // namespace dscpp::monitor
