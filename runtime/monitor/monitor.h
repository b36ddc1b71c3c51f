// MonitorMaster: DeepSpeed's monitors (deepspeed/monitor/monitor.py) as the ds_config sets
// them up. `tensorboard` writes TensorBoard event files and `csv_monitor` one CSV per event
// name, both under <output_path>/<job_name>/ exactly where DeepSpeed writes them. Only global
// rank 0 opens or writes anything (the engine passes 0 on its one reporting rank:
// EngineCore's InitArgs::holds_loss); every other rank's MonitorMaster is a no-op. `wandb` and
// `comet` need their Python services: not implemented (the config reader announces them).
// Every write_events call ends with the files flushed to the OS, so a crash of the process
// loses nothing already written. Errors throw dscpp::Error naming the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dscpp/runtime/monitor/event.h"

namespace dscpp {
struct DSConfig;       // config/ds_config.h; declared only, to keep nlohmann/json
struct MonitorConfig;  // out of the files that include this one
}  // namespace dscpp

namespace dscpp::monitor {

// Where DeepSpeed puts a monitor's files: os.path.join(output_path, job_name), so an empty
// output_path means <job_name>/ under the working directory.
std::string monitor_log_dir(const MonitorConfig& config);

class CsvMonitor;
class TensorBoardMonitor;

class MonitorMaster {
 public:
  // Opens the enabled monitors on rank 0: creates their folders and TensorBoard's event file.
  MonitorMaster(const DSConfig& config, int64_t global_rank);
  MonitorMaster(const MonitorConfig& tensorboard, const MonitorConfig& csv_monitor,
                int64_t global_rank);
  ~MonitorMaster();
  MonitorMaster(MonitorMaster&&) noexcept;
  MonitorMaster& operator=(MonitorMaster&&) noexcept;

  // DeepSpeed's `monitor.enabled`: a monitor we implement is on in the config. The same on
  // every rank, so all ranks agree on whether to gather events; only rank 0 writes them.
  bool enabled() const { return enabled_; }

  // Appends the events to every open monitor, in order, then flushes. No-op off rank 0.
  void write_events(const std::vector<Event>& events);
  void flush();

  // The event file TensorBoard reads; empty where no TensorBoard monitor is open.
  std::string tensorboard_file() const;

 private:
  bool enabled_ = false;
  std::unique_ptr<TensorBoardMonitor> tensorboard_;  // null: off, or not rank 0
  std::unique_ptr<CsvMonitor> csv_;                  // null: off, or not rank 0
};

}  // namespace dscpp::monitor
