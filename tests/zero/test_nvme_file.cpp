// ZeRO-Infinity's swap files (zero/nvme_file.h, zero/nvme_swap.h) against a temporary
// directory: io_uring round trips in block_size pieces through a queue shallower than the
// request, a short read and a kernel error (ENOSPC from /dev/full) surfaced as errors naming
// the file, nvme_path checks naming the path, and the pipelined swapper (reads ahead, writes
// behind) keeping every element, in DeepSpeed's folder, removed at the end. The parameter
// swapper (zero/param_swap.h): chunks through at most buffer_count buffers, reads ahead, a
// write's buffer serving the next read, giving up reads ahead when buffers run short, and a
// file too large for what the disk allows as an error naming it.
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>

#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "dscpp/error.h"
#include "dscpp/zero/nvme_file.h"
#include "dscpp/zero/nvme_swap.h"
#include "dscpp/zero/param_swap.h"

namespace fs = std::filesystem;
using dscpp::zero::AioOptions;
using dscpp::zero::make_swap_folder;
using dscpp::zero::NvmeFile;
using dscpp::zero::NvmeOptions;
using dscpp::zero::NvmeSwapper;
using dscpp::zero::ParamNvmeOptions;
using dscpp::zero::ParamSwapper;
using dscpp::zero::remove_swap_folder;

namespace {

fs::path temp_dir() {
  fs::path p =
      fs::temp_directory_path() / ("dscpp_nvme_" + std::to_string(::getpid()) + "_" +
                                   ::testing::UnitTest::GetInstance()->current_test_info()->name());
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const dscpp::Error& e) {
    return e.what();
  }
  return "";
}

void round_trip(const AioOptions& aio) {
  const fs::path dir = temp_dir();
  const std::string path = (dir / "x.tensor.swp").string();
  const at::Tensor src = at::arange(10000, at::TensorOptions().dtype(at::kFloat));
  {
    NvmeFile f(path, aio, /*create=*/true, src.numel() * 4);
    EXPECT_EQ(fs::file_size(path), 40000u);  // reserved up front
    const int64_t t = f.write(0, src.data_ptr(), 40000);
    f.wait(t);
    at::Tensor back = at::zeros({10000}, at::kFloat);
    f.wait(f.read(0, back.data_ptr(), 40000));
    EXPECT_TRUE(at::equal(back, src));
    // A range at an odd offset, not a multiple of the block: elements 1234 to 5678.
    at::Tensor part = at::zeros({4444}, at::kFloat);
    const int64_t a = f.read(1234 * 4, part.data_ptr(), 4444 * 4);
    const int64_t b = f.write(0, src.narrow(0, 5000, 10).data_ptr(), 40);  // two in flight
    f.wait(a);
    f.wait(b);
    EXPECT_TRUE(at::equal(part, src.narrow(0, 1234, 4444)));
    f.wait(f.read(0, part.data_ptr(), 40));
    EXPECT_TRUE(at::equal(part.narrow(0, 0, 10), src.narrow(0, 5000, 10)));
  }
  EXPECT_FALSE(fs::exists(path));  // a file it made goes with it
  fs::remove_all(dir);
}

}  // namespace

TEST(NvmeFile, RoundTripInBlockSizePiecesThroughAShallowQueue) {
  // 40000 bytes in pieces of 4096 (10 pieces) with at most 2 in flight.
  round_trip({/*block_size=*/4096, /*queue_depth=*/2, /*single_submit=*/false});
  round_trip({/*block_size=*/1048576, /*queue_depth=*/8, /*single_submit=*/false});
}

TEST(NvmeFile, SingleSubmitRoundTrips) {
  round_trip({/*block_size=*/1000, /*queue_depth=*/3, /*single_submit=*/true});
}

TEST(NvmeFile, ShortReadIsAnErrorNamingTheFile) {
  const fs::path dir = temp_dir();
  const std::string path = (dir / "short.tensor.swp").string();
  NvmeFile f(path, {}, /*create=*/true, 100);
  char buf[300];
  const std::string err = error_of([&] { f.wait(f.read(0, buf, 300)); });
  EXPECT_NE(err.find(path), std::string::npos) << err;
  EXPECT_NE(err.find("short read"), std::string::npos) << err;
  // The file is still usable after.
  EXPECT_EQ(error_of([&] { f.wait(f.read(0, buf, 100)); }), "");
  fs::remove_all(dir);
}

TEST(NvmeFile, KernelErrorIsAnErrorNamingTheFile) {
  // /dev/full answers every write with ENOSPC, as a full disk does.
  if (!fs::exists("/dev/full")) {
    GTEST_SKIP() << "no /dev/full";
  }
  NvmeFile f("/dev/full", {}, /*create=*/false);
  char buf[4096] = {};
  const std::string err = error_of([&] { f.wait(f.write(0, buf, sizeof buf)); });
  EXPECT_NE(err.find("'/dev/full'"), std::string::npos) << err;
  EXPECT_NE(err.find("No space left on device"), std::string::npos) << err;
  EXPECT_NE(err.find("full"), std::string::npos) << err;
  // A file that cannot be opened says which.
  const std::string missing = "/nonexistent_dscpp_dir/x.swp";
  const std::string open_err = error_of([&] { NvmeFile g(missing, {}, /*create=*/false); });
  EXPECT_NE(open_err.find(missing), std::string::npos) << open_err;
}

TEST(NvmeSwapper, BadNvmePathIsAnErrorNamingIt) {
  const fs::path dir = temp_dir();
  NvmeOptions o;
  o.path = (dir / "missing").string();
  EXPECT_NE(error_of([&] { NvmeSwapper s(o, 10); }).find("'" + o.path + "': does not exist"),
            std::string::npos);
  std::ofstream(dir / "plain") << "x";
  o.path = (dir / "plain").string();
  EXPECT_NE(error_of([&] { NvmeSwapper s(o, 10); }).find("'" + o.path + "': is not a directory"),
            std::string::npos);
  // Not writable (/proc refuses new folders even to root).
  o.path = "/proc";
  const std::string err = error_of([&] { NvmeSwapper s(o, 10); });
  EXPECT_NE(err.find("zero_optimization.offload_optimizer.nvme_path '/proc'"), std::string::npos)
      << err;
  fs::remove_all(dir);
}

// Two ranks share nvme_path/zero_stage_3/float32params: one remaking its swapper (its old
// folder and the then-empty parents go) while the other makes its own folder must not make
// the second fail on a parent taken away between its two mkdirs (seen in CI as ENOENT).
TEST(NvmeSwapper, FoldersMadeWhileAnotherRankRemovesTheirParents) {
  const fs::path dir = temp_dir();
  const auto parts = [](int rank) {
    return std::vector<std::string>{"zero_stage_3", "float32params", fmt::format("rank{}", rank)};
  };
  constexpr int kRounds = 2000;
  std::string errors[2];
  const auto churn = [&](int rank) {
    try {
      for (int i = 0; i < kRounds; ++i)
        remove_swap_folder(make_swap_folder(dir.string(), "nvme_path", parts(rank)), 2);
    } catch (const std::exception& e) {
      errors[rank] = e.what();
    }
  };
  std::thread other(churn, 1);
  churn(0);
  other.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  EXPECT_TRUE(fs::is_empty(dir));  // the last to go removed the shared parents
  fs::remove_all(dir);
}

TEST(NvmeSwapper, PipelinedStepKeepsEveryElementInDeepSpeedsFolder) {
  const fs::path dir = temp_dir();
  for (int64_t buffers : {1, 2, 3, 4}) {
    SCOPED_TRACE(buffers);
    NvmeOptions o;
    o.path = dir.string();
    o.stage = 2;
    o.rank = 3;
    o.buffer_count = buffers;
    o.aio.block_size = 256;  // several pieces per range
    o.aio.queue_depth = 2;
    const int64_t n = 1000;
    {
      NvmeSwapper s(o, n);
      const fs::path folder = dir / "zero_stage_2" / "optimizer" / "rank3";
      EXPECT_EQ(s.folder(), folder.string());
      s.add("fp32_master");
      s.add("sum", 0.5f);
      s.fill("sum", 900, 1000, 2.0f);
      EXPECT_TRUE(fs::exists(folder / "fp32_master.tensor.swp"));
      EXPECT_EQ(s.bytes_on_disk(), 2 * n * 4);
      s.write_all("fp32_master", at::arange(n, at::TensorOptions().dtype(at::kFloat)));
      for (int step = 0; step < 2; ++step) {
        // Uneven ranges, one empty, in an order that is not the files' own.
        std::vector<std::pair<int64_t, int64_t>> ranges = {
            {500, 1000}, {0, 130}, {130, 130}, {130, 400}, {400, 500}};
        s.plan(ranges);
        for (const auto& [b, e] : ranges) {
          auto held = s.acquire(b, e);
          ASSERT_EQ(held.at("sum").numel(), e - b);
          // What was there: the master's last values, the state's.
          const at::Tensor want = at::arange(b, e, at::TensorOptions().dtype(at::kFloat)) + step;
          EXPECT_TRUE(at::equal(held.at("fp32_master"), want)) << b;
          held.at("fp32_master").add_(1);
          held.at("sum").mul_(2);
          s.release();
        }
        s.finish();
        EXPECT_LE(s.buffer_numel(), buffers * 2 * 500);  // only the buffers in memory
      }
      const at::Tensor sum = s.read_all("sum");
      EXPECT_TRUE(at::equal(sum.narrow(0, 0, 900), at::full({900}, 2.0f)));
      EXPECT_TRUE(at::equal(sum.narrow(0, 900, 100), at::full({100}, 8.0f)));
      // Out of the planned order is an error, not a silent mix-up.
      s.plan({{0, 10}, {10, 20}});
      EXPECT_NE(error_of([&] { s.acquire(10, 20); }).find("out of the planned order"),
                std::string::npos);
      s.finish();
    }
    // The files and the folders made for them are gone; nvme_path itself stays.
    EXPECT_TRUE(fs::is_empty(dir));
  }
  fs::remove_all(dir);
}

TEST(ParamSwapper, ChunksGoThroughAtMostBufferCountBuffersInDeepSpeedsFolder) {
  const fs::path dir = temp_dir();
  ParamNvmeOptions o;
  o.path = dir.string();
  o.rank = 1;
  o.buffer_count = 2;
  o.buffer_size = 300;
  o.aio.block_size = 256;  // several pieces per chunk
  o.aio.queue_depth = 2;
  const std::vector<int64_t> chunks = {100, 300, 40, 200, 120};
  const auto bf16 = at::TensorOptions().dtype(at::kBFloat16);
  auto values = [&](int b, int version) { return at::arange(chunks[b], bf16) + 100 * b + version; };
  {
    // Bucket 0 stays in memory (ParamStore's max_in_cpu): no file.
    ParamSwapper s(o, at::kBFloat16, chunks, {false, true, true, true, true});
    const fs::path folder = dir / "zero_stage_3" / "bfloat16params" / "rank1";
    EXPECT_EQ(s.folder(), folder.string());
    EXPECT_FALSE(fs::exists(folder / "0_param.tensor.swp"));
    for (int b = 1; b < 5; ++b) {
      EXPECT_EQ(fs::file_size(folder / (std::to_string(b) + "_param.tensor.swp")),
                static_cast<uintmax_t>(chunks[b] * 2));
      s.stage_write(b).copy_(values(b, 0));
      s.write(b);  // the oldest write is waited for when a third buffer is wanted
      EXPECT_LE(s.buffers_in_use(), 2);
    }
    EXPECT_EQ(s.bytes_on_disk(), (300 + 40 + 200 + 120) * 2);
    s.wait_writes();
    EXPECT_EQ(s.buffers_in_use(), 0);
    // Two reads ahead take both buffers; a third finds none free and issues nothing.
    EXPECT_TRUE(s.read_ahead(1));
    EXPECT_TRUE(s.read_ahead(2));
    EXPECT_FALSE(s.read_ahead(3));
    EXPECT_FALSE(s.has_buffer(3));
    EXPECT_TRUE(at::equal(s.acquire(1), values(1, 0)));
    EXPECT_EQ(s.reads_ahead_used(), 1);
    // Bucket 4 is wanted while 1 is held: the read ahead of 2 (not acquired) is given up.
    EXPECT_TRUE(s.buffer_available());
    EXPECT_TRUE(at::equal(s.acquire(4), values(4, 0)));
    EXPECT_FALSE(s.has_buffer(2));
    // Both held by gathers: nothing more without a let_go.
    EXPECT_FALSE(s.buffer_available());
    EXPECT_NE(error_of([&] { s.acquire(3); }).find("held by gathers"), std::string::npos);
    s.let_go(1);
    s.let_go(4);
    // An update written, then read at once: its buffer serves the read.
    s.stage_write(3).copy_(values(3, 7));
    s.write(3);
    const int64_t reads = s.reads();
    EXPECT_TRUE(s.read_ahead(3));
    EXPECT_EQ(s.reads(), reads);
    EXPECT_TRUE(at::equal(s.acquire(3), values(3, 7)));
    s.let_go(3);
    // And from the file once the buffer has gone to others.
    s.acquire(1);
    s.acquire(2);
    s.let_go(1);
    s.let_go(2);
    EXPECT_TRUE(at::equal(s.acquire(3), values(3, 7)));
    s.let_go(3);
    EXPECT_EQ(s.peak_buffers_in_use(), 2);
    EXPECT_EQ(s.buffer_numel(), 2 * 300);  // as large as the largest swapped chunk
    EXPECT_EQ(s.writes(), 5);
  }
  // The files and the folders made for them are gone; nvme_path itself stays.
  EXPECT_TRUE(fs::is_empty(dir));
  // A chunk larger than buffer_size is refused by name.
  o.buffer_size = 200;
  const std::string err = error_of([&] {
    ParamSwapper s(o, at::kBFloat16, chunks, {true, true, true, true, true});
  });
  EXPECT_NE(err.find("zero_optimization.offload_param.buffer_size: 200 elements"),
            std::string::npos)
      << err;
  EXPECT_NE(err.find("raise buffer_size to at least 300"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

TEST(ParamSwapper, AFileTheDiskCannotHoldIsAnErrorNamingIt) {
  const fs::path dir = temp_dir();
  ParamNvmeOptions o;
  o.path = dir.string();
  // Files may grow to 1000 bytes (as a disk with 1000 bytes free); the chunk needs 4000.
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 1000;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::string err = error_of([&] {
    ParamSwapper s(o, at::kFloat, {100, 1000}, {false, true});
  });
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  const std::string file =
      (dir / "zero_stage_3" / "float32params" / "rank0" / "1_param.tensor.swp");
  EXPECT_NE(err.find("'" + file + "': cannot reserve 4000 bytes"), std::string::npos) << err;
  EXPECT_TRUE(fs::is_empty(dir));  // nothing left behind
  // A nvme_path that cannot be written: its key and path named.
  o.path = "/proc";
  const std::string perr = error_of([&] { ParamSwapper s(o, at::kFloat, {10}, {true}); });
  EXPECT_NE(perr.find("zero_optimization.offload_param.nvme_path '/proc': cannot make the swap "
                      "folder"),
            std::string::npos)
      << perr;
  fs::remove_all(dir);
}
