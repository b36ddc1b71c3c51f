// DeepSpeed's csv_monitor (deepspeed/monitor/csv_monitor.py), byte for byte: for an event
// named "Train/Samples/train_loss" it appends to <log_dir>/Train_Samples_train_loss.csv
// ('/' and ' ' become '_'), the first time this monitor meets that file a header row
// "step,train_loss" (the name's last '/' part), then one "step,value" row per event.
// Rows end in "\r\n" and fields are quoted as Python's csv.writer does; values print as
// Python's str(float). Files stay open and are flushed at the end of every write_events.
#pragma once

#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dscpp/runtime/monitor/event.h"

namespace dscpp::monitor {

class CsvMonitor {
 public:
  explicit CsvMonitor(const std::string& log_dir);  // creates log_dir
  ~CsvMonitor();
  CsvMonitor(const CsvMonitor&) = delete;
  CsvMonitor& operator=(const CsvMonitor&) = delete;

  void write_events(const std::vector<Event>& events);
  void flush();

  // The file an event name goes to.
  std::string file_for(const std::string& event_name) const;

 private:
  using OpenFile = std::pair<const std::string, std::FILE*>;  // path, open file
  OpenFile& open_for(const std::string& event_name);          // opens and heads a file met first

  std::string log_dir_;
  std::map<std::string, std::FILE*> files_;  // by path: every file met so far, open
};

// Python's repr(float) / str(float): the shortest digits that read back to `v`, positional
// for exponents -4..15 ("0.0001", "123.0") and scientific beyond ("1e-05", "1.5e+16");
// "nan", "inf", "-inf".
std::string python_float_repr(double v);

// One CSV field as Python's csv.writer (excel dialect, QUOTE_MINIMAL) writes it: quoted, with
// quotes doubled, when it holds a ',', '"', '\r' or '\n'.
std::string csv_field(const std::string& s);

}  // namespace dscpp::monitor
