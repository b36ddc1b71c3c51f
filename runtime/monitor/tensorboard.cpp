// DeepSpeed's TensorBoard monitor: scalar events as TFRecord-framed protobuf records. The one
// translation unit that sees protobuf.
#include "dscpp/runtime/monitor/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include "dscpp/error.h"
#include "dscpp/runtime/monitor/tfrecord.h"
#include "tensorboard_event.pb.h"  // generated from tensorboard_event.proto

namespace dscpp::monitor {
namespace {

[[noreturn]] void fail(const std::string& path, const std::string& what, int err) {
  throw dscpp::Error("dscpp tensorboard monitor: " + what + " '" + path +
                     "': " + std::strerror(err));
}

double wall_time() {
  using Seconds = std::chrono::duration<double>;
  return std::chrono::duration_cast<Seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// TensorBoard's EventFileWriter: "events.out.tfevents.%010d.%s.%s.%s" % (time.time(),
// socket.gethostname(), os.getpid(), a per-process counter), so two writers in one second
// never share a file. TensorBoard reads any file whose name holds "tfevents".
std::string event_file_name() {
  static std::atomic<int> counter{0};
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) std::strcpy(host, "localhost");
  char seconds[32];
  std::snprintf(seconds, sizeof(seconds), "%010lld", static_cast<long long>(std::time(nullptr)));
  return std::string("events.out.tfevents.") + seconds + "." + host + "." +
         std::to_string(getpid()) + "." + std::to_string(counter++);
}

}  // namespace

struct TensorBoardMonitor::Impl {
  std::string path;
  std::FILE* file = nullptr;
  tbproto::Event event;  // reused for every record
  std::string bytes;     // its serialization

  ~Impl() {
    if (file) std::fclose(file);
  }

  // Appends `event` as one record to `out`.
  void frame(std::string& out) {
    bytes.clear();
    if (!event.SerializeToString(&bytes)) fail(path, "cannot serialize an event for", EINVAL);
    out += tfrecord(bytes);
  }
  void write(const std::string& records) {
    if (std::fwrite(records.data(), 1, records.size(), file) != records.size())
      fail(path, "cannot write", errno);
  }
};

TensorBoardMonitor::TensorBoardMonitor(const std::string& log_dir)
    : impl_(std::make_unique<Impl>()) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec)
    throw dscpp::Error("dscpp tensorboard monitor: cannot create folder '" + log_dir +
                       "': " + ec.message());
  impl_->path = (std::filesystem::path(log_dir) / event_file_name()).string();
  impl_->file = std::fopen(impl_->path.c_str(), "wb");
  if (!impl_->file) fail(impl_->path, "cannot create", errno);

  // The first record, as TensorBoard's own writer starts every file.
  impl_->event.set_wall_time(wall_time());
  impl_->event.set_file_version("brain.Event:2");
  impl_->event.mutable_source_metadata()->set_writer("dscpp.monitor");
  std::string records;
  impl_->frame(records);
  impl_->write(records);
  flush();
}

TensorBoardMonitor::~TensorBoardMonitor() = default;

void TensorBoardMonitor::write_events(const std::vector<Event>& events) {
  std::string records;
  for (const Event& e : events) {
    // SummaryWriter.add_scalar: one Event per scalar, stamped when it is added, the value
    // stored as a float32 simple_value.
    impl_->event.Clear();
    impl_->event.set_wall_time(wall_time());
    impl_->event.set_step(e.step);
    auto* value = impl_->event.mutable_summary()->add_value();
    value->set_tag(e.name);
    value->set_simple_value(static_cast<float>(e.value));
    impl_->frame(records);
  }
  impl_->write(records);
  flush();
}

void TensorBoardMonitor::flush() {
  if (std::fflush(impl_->file) != 0) fail(impl_->path, "cannot write", errno);
}

const std::string& TensorBoardMonitor::file() const {
  return impl_->path;
}

}  // namespace dscpp::monitor
