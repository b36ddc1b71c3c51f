// DeepSpeed's tensorboard monitor (deepspeed/monitor/tensorboard.py, which calls
// torch.utils.tensorboard's SummaryWriter.add_scalar): one event file in the log folder,
// named as TensorBoard's own writer names it, events.out.tfevents.<10-digit seconds>.
// <hostname>.<pid>.<n>. Its first record says file_version "brain.Event:2"; then each event
// is one record with wall_time, step and a Summary value {tag: name, simple_value: value}
// (float32, as add_scalar stores it). Records are TFRecord-framed protobuf messages; the
// protobuf code stays inside tensorboard.cpp. Flushed at the end of every write_events.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "dscpp/runtime/monitor/event.h"

namespace dscpp::monitor {

class TensorBoardMonitor {
 public:
  // Creates log_dir and the event file, writes and flushes the file_version record.
  explicit TensorBoardMonitor(const std::string& log_dir);
  ~TensorBoardMonitor();
  TensorBoardMonitor(const TensorBoardMonitor&) = delete;
  TensorBoardMonitor& operator=(const TensorBoardMonitor&) = delete;

  void write_events(const std::vector<Event>& events);
  void flush();
  const std::string& file() const;

 private:
  struct Impl;  // the file and a reusable protobuf message
  std::unique_ptr<Impl> impl_;
};

}  // namespace dscpp::monitor
