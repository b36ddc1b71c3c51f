// ZeRO-Infinity's swap files (zero/nvme_file.h, zero/nvme_swap.h) against a temporary
// directory: io_uring round trips in block_size pieces through a queue shallower than the
// request, a short read and a kernel error (ENOSPC from /dev/full) surfaced as errors naming
// the file, nvme_path checks naming the path, and the pipelined swapper (reads ahead, writes
// behind) keeping every element, in DeepSpeed's folder, removed at the end.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include "dscpp/error.h"
#include "dscpp/zero/nvme_file.h"
#include "dscpp/zero/nvme_swap.h"

namespace fs = std::filesystem;
using dscpp::zero::AioOptions;
using dscpp::zero::NvmeFile;
using dscpp::zero::NvmeOptions;
using dscpp::zero::NvmeSwapper;

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
  if (!fs::exists("/dev/full")) GTEST_SKIP() << "no /dev/full";
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
