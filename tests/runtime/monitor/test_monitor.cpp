// MonitorMaster and its parts: who writes (rank 0, enabled monitors only), where DeepSpeed
// puts the files, the CSV bytes DeepSpeed writes, flushing, errors; CRC-32C and TFRecord
// framing against published vectors. What TensorBoard and DeepSpeed themselves read back is
// test_monitor_files.py's part.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "dscpp/config/ds_config.h"
#include "dscpp/runtime/monitor/csv_monitor.h"
#include "dscpp/runtime/monitor/monitor.h"
#include "dscpp/runtime/monitor/tfrecord.h"

namespace fs = std::filesystem;
using dscpp::MonitorConfig;
using dscpp::monitor::Event;
using dscpp::monitor::MonitorMaster;

namespace {

// A fresh folder, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "dscpp_monitor_XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

MonitorConfig on(const fs::path& output_path, std::string job_name = "job") {
  MonitorConfig c;
  c.enabled = true;
  c.output_path = output_path.string();
  c.job_name = std::move(job_name);
  return c;
}

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

size_t files_under(const fs::path& dir) {
  if (!fs::exists(dir)) return 0;
  size_t n = 0;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) n += entry.is_regular_file();
  return n;
}

const std::vector<Event> kEvents = {{"Train/Samples/train_loss", 2.5, 8},
                                    {"Train/Samples/lr", 1e-05, 8}};

}  // namespace

TEST(Crc32c, MatchesPublishedVectors) {
  using dscpp::monitor::crc32c;
  // RFC 3720 (iSCSI) B.4 and the "check" value of the CRC-32C catalogue entry.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(crc32c(""), 0u);
  // Extending a CRC equals the CRC of the concatenation.
  EXPECT_EQ(crc32c("6789", crc32c("12345")), crc32c("123456789"));
}

TEST(Tfrecord, FramesLengthDataAndMaskedCrcs) {
  using dscpp::monitor::masked_crc32c;
  const std::string data = "hello";
  const std::string r = dscpp::monitor::tfrecord(data);
  ASSERT_EQ(r.size(), 8 + 4 + data.size() + 4);
  EXPECT_EQ(r.substr(0, 8), std::string("\x05\0\0\0\0\0\0\0", 8));  // little-endian length
  auto u32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(r[at + i]);
    return v;
  };
  EXPECT_EQ(u32(8), masked_crc32c(r.substr(0, 8)));
  EXPECT_EQ(r.substr(12, data.size()), data);
  EXPECT_EQ(u32(12 + data.size()), masked_crc32c(data));
  // TensorFlow's mask: rotate right 15, add a constant.
  const uint32_t crc = dscpp::monitor::crc32c("123456789");
  EXPECT_EQ(masked_crc32c("123456789"), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

TEST(PythonFloatRepr, MatchesPythonsReprOfFloat) {
  using dscpp::monitor::python_float_repr;
  const double inf = std::numeric_limits<double>::infinity();
  const std::pair<double, const char*> cases[] = {
      {0.0, "0.0"},
      {-0.0, "-0.0"},
      {1.0, "1.0"},
      {2.5, "2.5"},
      {0.1, "0.1"},
      {1.0 / 3, "0.3333333333333333"},
      {123456.0, "123456.0"},
      {0.0001, "0.0001"},
      {0.00001, "1e-05"},
      {1.5e-7, "1.5e-07"},
      {1e15, "1000000000000000.0"},
      {1e16, "1e+16"},
      {1.2345e16, "1.2345e+16"},
      {65536.0, "65536.0"},
      {-3.25, "-3.25"},
      {1e100, "1e+100"},
      {5e-324, "5e-324"},
      {1.7976931348623157e308, "1.7976931348623157e+308"},
      {inf, "inf"},
      {-inf, "-inf"},
      {std::nan(""), "nan"},
  };
  for (const auto& [v, want] : cases) EXPECT_EQ(python_float_repr(v), want) << want;
}

TEST(CsvField, QuotesAsPythonsCsvWriter) {
  using dscpp::monitor::csv_field;
  EXPECT_EQ(csv_field("train_loss"), "train_loss");
  EXPECT_EQ(csv_field("loss scale"), "loss scale");
  EXPECT_EQ(csv_field("a,b"), "\"a,b\"");
  EXPECT_EQ(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
  EXPECT_EQ(csv_field("two\nlines"), "\"two\nlines\"");
}

TEST(MonitorLogDir, JoinsOutputPathAndJobNameAsOsPathJoin) {
  using dscpp::monitor::monitor_log_dir;
  EXPECT_EQ(monitor_log_dir(on("out")), "out/job");
  EXPECT_EQ(monitor_log_dir(on("out/")), "out/job");
  EXPECT_EQ(monitor_log_dir(on("")), "job");
  EXPECT_EQ(monitor_log_dir(on("out", "/abs")), "/abs");
}

TEST(MonitorMaster, BuildsFromTheDsConfigSections) {
  TempDir dir;
  const nlohmann::json j = {
      {"train_batch_size", 8},
      {"tensorboard", {{"enabled", true}, {"output_path", (dir.path() / "tb").string()}}},
      {"csv_monitor",
       {{"enabled", true}, {"output_path", (dir.path() / "csv").string()}, {"job_name", "run1"}}}};
  MonitorMaster monitor(dscpp::parse_ds_config(j), 0);
  EXPECT_TRUE(monitor.enabled());
  monitor.write_events(kEvents);
  // TensorBoard's job_name defaults to DeepSpeed's "DeepSpeedJobName".
  const fs::path tb_file = monitor.tensorboard_file();
  EXPECT_EQ(tb_file.parent_path(), dir.path() / "tb" / "DeepSpeedJobName");
  EXPECT_EQ(tb_file.filename().string().rfind("events.out.tfevents.", 0), 0u);
  EXPECT_EQ(read(dir.path() / "csv" / "run1" / "Train_Samples_train_loss.csv"),
            "step,train_loss\r\n8,2.5\r\n");
  EXPECT_EQ(read(dir.path() / "csv" / "run1" / "Train_Samples_lr.csv"), "step,lr\r\n8,1e-05\r\n");
}

TEST(MonitorMaster, NonZeroRankWritesNothing) {
  TempDir dir;
  for (int64_t rank : {1, 7}) {
    MonitorMaster monitor(on(dir.path()), on(dir.path()), rank);
    EXPECT_TRUE(monitor.enabled());  // as DeepSpeed's: the same on every rank
    monitor.write_events(kEvents);
    monitor.flush();
    EXPECT_EQ(monitor.tensorboard_file(), "");
  }
  EXPECT_FALSE(fs::exists(dir.path() / "job"));
  EXPECT_EQ(files_under(dir.path()), 0u);
}

TEST(MonitorMaster, DisabledMonitorsWriteNothing) {
  TempDir dir;
  MonitorConfig off = on(dir.path());
  off.enabled = false;
  MonitorMaster monitor(off, off, 0);
  EXPECT_FALSE(monitor.enabled());
  monitor.write_events(kEvents);
  monitor.flush();
  EXPECT_FALSE(fs::exists(dir.path() / "job"));
  EXPECT_EQ(files_under(dir.path()), 0u);
}

TEST(MonitorMaster, EachMonitorWritesOnlyWhenItsSectionIsOn) {
  TempDir dir;
  MonitorConfig off;
  {
    MonitorMaster monitor(off, on(dir.path() / "csv"), 0);
    monitor.write_events(kEvents);
    EXPECT_EQ(monitor.tensorboard_file(), "");
  }
  EXPECT_EQ(files_under(dir.path() / "csv"), 2u);
  {
    MonitorMaster monitor(on(dir.path() / "tb"), off, 0);
    monitor.write_events(kEvents);
  }
  EXPECT_EQ(files_under(dir.path() / "tb"), 1u);
}

TEST(MonitorMaster, FilesAreFlushedAtTheEndOfEveryWriteEvents) {
  TempDir dir;
  MonitorMaster monitor(on(dir.path()), on(dir.path()), 0);
  const fs::path tb = monitor.tensorboard_file();
  const auto first_record = fs::file_size(tb);
  EXPECT_GT(first_record, 16u);  // the file_version record, already on disk
  monitor.write_events({{"Train/Samples/train_loss", 2.5, 8}});
  const fs::path csv = dir.path() / "job" / "Train_Samples_train_loss.csv";
  EXPECT_EQ(read(csv), "step,train_loss\r\n8,2.5\r\n");  // the monitor is still open
  const auto after_one = fs::file_size(tb);
  EXPECT_GT(after_one, first_record);
  monitor.write_events({{"Train/Samples/train_loss", 2.25, 16}});
  EXPECT_EQ(read(csv), "step,train_loss\r\n8,2.5\r\n16,2.25\r\n");
  EXPECT_GT(fs::file_size(tb), after_one);
}

TEST(MonitorMaster, AResumedRunAppendsAfterAHeaderOfItsOwnAsDeepSpeedDoes) {
  TempDir dir;
  MonitorConfig off;
  for (int64_t step : {8, 16}) {
    MonitorMaster monitor(off, on(dir.path()), 0);
    monitor.write_events({{"loss", 1.0, step}});
    monitor.write_events({{"loss", 0.5, step + 1}});
  }
  EXPECT_EQ(read(dir.path() / "job" / "loss.csv"),
            "step,loss\r\n8,1.0\r\n9,0.5\r\nstep,loss\r\n16,1.0\r\n17,0.5\r\n");
}

TEST(MonitorMaster, AnUnwritableOutputPathNamesTheFolder) {
  TempDir dir;
  std::ofstream(dir.path() / "a_file") << "x";
  MonitorConfig off;
  const fs::path bad = dir.path() / "a_file";
  for (int which = 0; which < 2; ++which) {
    try {
      if (which == 0)
        MonitorMaster(on(bad), off, 0);
      else
        MonitorMaster(off, on(bad), 0);
      ADD_FAILURE() << "no error for an output_path under a file";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find((bad / "job").string()), std::string::npos) << e.what();
    }
  }
}
