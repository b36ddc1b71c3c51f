// MonitorMaster: opens the ds_config's monitors on rank 0 and fans events out to them.
#include "dscpp/runtime/monitor/monitor.h"

#include <filesystem>

#include "dscpp/config/ds_config.h"
#include "dscpp/runtime/monitor/csv_monitor.h"
#include "dscpp/runtime/monitor/tensorboard.h"

namespace dscpp::monitor {

std::string monitor_log_dir(const MonitorConfig& config) {
  // std::filesystem's operator/ joins as os.path.join does (an absolute job_name wins).
  return (std::filesystem::path(config.output_path) / config.job_name).string();
}

MonitorMaster::MonitorMaster(const DSConfig& config, int64_t global_rank)
    : MonitorMaster(config.tensorboard, config.csv_monitor, global_rank) {}

MonitorMaster::MonitorMaster(const MonitorConfig& tensorboard, const MonitorConfig& csv_monitor,
                             int64_t global_rank)
    : enabled_(tensorboard.enabled || csv_monitor.enabled) {
  if (global_rank != 0) return;
  if (tensorboard.enabled)
    tensorboard_ = std::make_unique<TensorBoardMonitor>(monitor_log_dir(tensorboard));
  if (csv_monitor.enabled) csv_ = std::make_unique<CsvMonitor>(monitor_log_dir(csv_monitor));
}

MonitorMaster::~MonitorMaster() = default;
MonitorMaster::MonitorMaster(MonitorMaster&&) noexcept = default;
MonitorMaster& MonitorMaster::operator=(MonitorMaster&&) noexcept = default;

void MonitorMaster::write_events(const std::vector<Event>& events) {
  // DeepSpeed's order: tensorboard, then csv.
  if (tensorboard_) tensorboard_->write_events(events);
  if (csv_) csv_->write_events(events);
}

void MonitorMaster::flush() {
  if (tensorboard_) tensorboard_->flush();
  if (csv_) csv_->flush();
}

std::string MonitorMaster::tensorboard_file() const {
  return tensorboard_ ? tensorboard_->file() : std::string();
}

}  // namespace dscpp::monitor
