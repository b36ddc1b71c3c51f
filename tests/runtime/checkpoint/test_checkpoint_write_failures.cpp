// A checkpoint write the file system refuses: a file-size limit (EFBIG, `ulimit -f`) and a
// full disk (ENOSPC, from /dev/full and from a small tmpfs). Every writer of checkpoint files
// (torch.save files, safetensors, `latest`, the recovery script) throws a CheckpointError that
// names the file and strerror, leaves no .tmp file, and leaves the file it would have
// replaced as it was; the engine's save_checkpoint does the same on every rank, leaves
// `latest` naming the last complete checkpoint, and the engine trains and saves on after it.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "dscpp/dscpp.h"
#include "dscpp/runtime/checkpoint/checkpoint_error.h"
#include "dscpp/runtime/checkpoint/ds_layout.h"
#include "dscpp/runtime/checkpoint/recovery_script.h"
#include "dscpp/runtime/checkpoint/safetensors.h"
#include "dscpp/runtime/checkpoint/torch_file.h"

using dscpp::checkpoint::CheckpointError;
using dscpp::checkpoint::PyValue;
namespace fs = std::filesystem;
namespace ckpt = dscpp::checkpoint;

namespace {

// A soft limit on the size of files this process writes, with SIGXFSZ ignored (its default
// action kills the process; ignored, the write fails with EFBIG), both restored on exit.
class FileSizeLimit {
 public:
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &old_);
    old_handler_ = std::signal(SIGXFSZ, SIG_IGN);
    rlimit lower = old_;
    lower.rlim_cur = bytes;
    EXPECT_EQ(setrlimit(RLIMIT_FSIZE, &lower), 0) << std::strerror(errno);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &old_);
    std::signal(SIGXFSZ, old_handler_);
  }

 private:
  rlimit old_{};
  void (*old_handler_)(int) = SIG_DFL;
};

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every file under `dir` whose name ends in ".tmp".
std::vector<std::string> tmp_files(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().string().size() > 4 && e.path().extension() == ".tmp")
      out.push_back(e.path().string());
  return out;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError)";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

class WriteFailures : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("dscpp_write_fail_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

// Each writer, its file already there with older contents.
struct Writer {
  std::string name;
  std::string file;  // under the test's folder
  std::function<void(const std::string& dir)> write;
};
std::vector<Writer> writers() {
  const at::Tensor big = at::arange(1 << 16, at::kFloat);  // 256 KiB
  return {
      {"save_torch_file", "model.pt",
       [big](const std::string& d) {
         auto v = PyValue::dict();
         v.set("w", big);
         ckpt::save_torch_file(v, d + "/model.pt");
       }},
      {"save_safetensors", "model.safetensors",
       [big](const std::string& d) {
         ckpt::save_safetensors({{"w", big}}, d + "/model.safetensors");
       }},
      {"write_latest", "latest",
       [](const std::string& d) { ckpt::write_latest(d, "global_step" + std::string(4096, '9')); }},
      {"write_zero_to_fp32_script", "zero_to_fp32.py",
       [](const std::string& d) { ckpt::write_zero_to_fp32_script(d); }},
  };
}

}  // namespace

TEST_F(WriteFailures, AFileSizeLimitIsAnErrorNamingTheFileAndLeavesNothingBehind) {
  for (const Writer& w : writers()) {
    SCOPED_TRACE(w.name);
    const fs::path file = dir_ / w.file;
    std::ofstream(file) << "before";
    std::string e;
    {
      FileSizeLimit limit(1024);
      e = error_of([&] { w.write(dir_.string()); });
    }
    EXPECT_TRUE(has(e, (dir_ / w.file).string() + ".tmp")) << e;
    EXPECT_TRUE(has(e, std::strerror(EFBIG))) << e;
    EXPECT_EQ(tmp_files(dir_), std::vector<std::string>{});
    EXPECT_EQ(read(file), "before");
    // Without the limit the same write succeeds.
    w.write(dir_.string());
    EXPECT_NE(read(file), "before");
  }
}

// ENOSPC without a full disk: the .tmp name a writer opens is a link to /dev/full, whose
// every write fails with ENOSPC. Removing the .tmp removes the link.
TEST_F(WriteFailures, AFullDiskIsAnErrorNamingTheFileAndLeavesNothingBehind) {
  if (!fs::exists("/dev/full")) {
    GTEST_SKIP() << "no /dev/full on this system";
  }
  for (const Writer& w : writers()) {
    SCOPED_TRACE(w.name);
    const fs::path file = dir_ / w.file;
    std::ofstream(file) << "before";
    fs::create_symlink("/dev/full", file.string() + ".tmp");
    const std::string e = error_of([&] { w.write(dir_.string()); });
    EXPECT_TRUE(has(e, file.string() + ".tmp")) << e;
    EXPECT_TRUE(has(e, std::strerror(ENOSPC))) << e;
    EXPECT_FALSE(fs::exists(fs::symlink_status(file.string() + ".tmp")));
    EXPECT_EQ(read(file), "before");
    EXPECT_TRUE(fs::exists("/dev/full"));
  }
}

// A real full file system: a 64 KiB tmpfs in a child process's own mount namespace (gone with
// it). Mounting needs root and a system that allows it (a container may not): the test says
// why it skips. The child saves a value of 1 MiB without tensors, so that it runs nothing of
// LibTorch's thread pools after the fork.
TEST_F(WriteFailures, AFullTmpfsIsAnErrorNamingTheFile) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const std::string mnt = dir_.string();
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(fds[0]);
    auto report = [&](const std::string& text, int code) {
      if (::write(fds[1], text.data(), text.size()) < 0) code = 3;
      ::_exit(code);
    };
    if (::unshare(CLONE_NEWNS) != 0)
      report(std::string("unshare(CLONE_NEWNS): ") + std::strerror(errno), 77);
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      report(std::string("making / private: ") + std::strerror(errno), 77);
    if (::mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0)
      report(std::string("mount -t tmpfs: ") + std::strerror(errno), 77);
    auto v = PyValue::dict();
    v.set("text", std::string(1 << 20, 'x'));
    const std::string e = error_of([&] { ckpt::save_torch_file(v, mnt + "/model.pt"); });
    const bool clean = fs::is_empty(mnt);
    report(e, clean ? 0 : 1);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) text.append(buf, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died: " << text;
  if (WEXITSTATUS(status) == 77) {
    GTEST_SKIP() << "cannot mount a tmpfs here: " << text;
  }
  EXPECT_EQ(WEXITSTATUS(status), 0) << "files were left on the tmpfs; " << text;
  EXPECT_TRUE(has(text, mnt + "/model.pt.tmp")) << text;
  EXPECT_TRUE(has(text, std::strerror(ENOSPC))) << text;
}

namespace {

struct NetImpl : torch::nn::Module {
  NetImpl() {
    a = register_module("a", torch::nn::Linear(4, 64));
    b = register_module("b", torch::nn::Linear(64, 2));
  }
  at::Tensor forward(at::Tensor x) { return b(a(x).tanh()); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(Net);

template <typename E>
void train(E& engine) {
  at::Tensor x = at::sin(at::arange(16, at::kFloat).reshape({4, 4}) * (engine.global_steps() + 1))
                     .to(engine.device());  // the engine's module is on its device (a GPU's)
  engine.backward(engine.forward(x).square().mean());
  engine.step();
}

}  // namespace

// The engine: a failed save is a CheckpointError naming the file and the cause; `latest`
// still names the last complete tag, no .tmp is left, and training and saving go on.
TEST_F(WriteFailures, AFailedEngineSaveLeavesLatestAndTheEngineGoesOn) {
  for (int stage : {0, 1}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    fs::remove_all(dir_);
    Net net;
    auto engine =
        dscpp::initialize(net, {{"train_batch_size", 4},
                                {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                {"zero_optimization", {{"stage", stage}}}});
    train(engine);
    engine.save_checkpoint(dir_.string(), "good");
    const std::string d = dir_.string();
    // A file-size limit smaller than the model-states file (a ZeRO file first at stage 1).
    train(engine);
    std::string e;
    {
      FileSizeLimit limit(1024);
      e = error_of([&] { engine.save_checkpoint(d, "efbig"); });
    }
    EXPECT_TRUE(has(e, (dir_ / "efbig").string())) << e;
    EXPECT_TRUE(has(e, ".pt.tmp': " + std::string(std::strerror(EFBIG)))) << e;
    EXPECT_EQ(ckpt::read_latest(d).value_or(""), "good");
    EXPECT_EQ(tmp_files(dir_), std::vector<std::string>{});
    // A full disk under the model-states file.
    if (fs::exists("/dev/full")) {
      fs::create_directories(dir_ / "enospc");
      const fs::path model = ckpt::model_states_path(d, "enospc");
      fs::create_symlink("/dev/full", model.string() + ".tmp");
      e = error_of([&] { engine.save_checkpoint(d, "enospc"); });
      EXPECT_TRUE(has(e, model.string() + ".tmp': " + std::strerror(ENOSPC))) << e;
      EXPECT_EQ(ckpt::read_latest(d).value_or(""), "good");
      EXPECT_EQ(tmp_files(dir_), std::vector<std::string>{});
    }
    // The engine trains on and saves again.
    train(engine);
    engine.save_checkpoint(d, "after");
    EXPECT_EQ(ckpt::read_latest(d).value_or(""), "after");
    Net other;
    auto resumed =
        dscpp::initialize(other, {{"train_batch_size", 4},
                                  {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 0.01}}}}},
                                  {"zero_optimization", {{"stage", stage}}}});
    resumed.load_checkpoint(d);
    EXPECT_EQ(resumed.global_steps(), 3);
  }
  fs::create_directories(dir_);
}
