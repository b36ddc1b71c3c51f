#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "hostfile.h"

namespace dscpp::launcher {
namespace {

// DeepSpeed's test_hostfile_good, plus the order check its dict comparison cannot make.
TEST(Hostfile, GoodFileWithBlankLinesAndComments) {
  const std::string text = R"(
    worker-1 slots=2
    worker-2 slots=2

    localhost slots=1
    123.23.12.10 slots=2

    #worker-1 slots=3
    # this is a comment

    )";
  const ResourcePool pool = parse_hostfile(text);
  const ResourcePool expected = {
      {"worker-1", 2}, {"worker-2", 2}, {"localhost", 1}, {"123.23.12.10", 2}};
  EXPECT_EQ(pool, expected);
}

TEST(Hostfile, TabsAndTrailingFieldsAreAccepted) {
  EXPECT_EQ(parse_hostfile("a\tslots=4\r\nb  slots=8 max_slots=8\n"),
            (ResourcePool{{"a", 4}, {"b", 8}}));
}

void expect_error(const std::string& text, const std::string& fragment) {
  try {
    parse_hostfile(text, "hf");
    ADD_FAILURE() << "no error for:\n" << text;
  } catch (const HostfileError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

// DeepSpeed's test_hostfiles_bad, checking that the message points at the line.
TEST(Hostfile, DuplicateHostNamesHostAndLine) {
  expect_error("worker-1 slots=2\nworker-2 slots=1\nworker-1 slots=1\n", "hf:3: host 'worker-1'");
}

TEST(Hostfile, MalformedLinesNameTheLine) {
  expect_error("\n    this is bad slots=1\n", "hf:2: bad entry 'this is bad slots=1'");
  expect_error("missingslots\n", "hf:1:");
  expect_error("worker-1 slots=2\nthis is bad slots=1\nworker-2 slots=4\nmissingslots\n", "hf:2:");
  expect_error("worker slots=\n", "hf:1:");
  expect_error("worker slots=4x\n", "hf:1:");
  expect_error("worker slots=-1\n", "hf:1:");
  expect_error("worker gpus=4\n", "hf:1:");
}

// A NUL in a host name was accepted and cut short when handed to ssh.
TEST(Hostfile, ControlBytesAreRefusedNamingLineAndColumn) {
  expect_error(std::string("worker-0 slots=2\nwork\0er-1 slots=2\n", 36),
               "hf:2:5: control byte 0x00 in the entry");
  expect_error("worker-0 slots=2\n\n  w\x1b[2J slots=1\n", "hf:3:4: control byte 0x1b");
  expect_error("w\x7f slots=1\n", "hf:1:2: control byte 0x7f");
  expect_error("w slots=1\x01\n", "hf:1:10: control byte 0x01");
  // Tabs and CRLF line ends are white space, not control bytes to refuse.
  EXPECT_EQ(parse_hostfile("a\tslots=1\r\n"), (ResourcePool{{"a", 1}}));
}

TEST(Hostfile, OversizedFileIsRefusedBeforeItIsParsed) {
  char path[] = "/tmp/dscpp_hostfile_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  {
    std::ofstream out(path);
    out << "node-a slots=2\n";
    out << std::string(kMaxHostfileBytes, '#') << "\n";
  }
  try {
    read_hostfile(path);
    ADD_FAILURE() << "a hostfile over the bound was read";
  } catch (const HostfileError& e) {
    EXPECT_NE(std::string(e.what()).find(std::string("hostfile ") + path + " is"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("more than the 1048576 a hostfile may have"),
              std::string::npos)
        << e.what();
  }
  std::remove(path);
}

TEST(Hostfile, EmptyFileIsAnError) {
  expect_error("\n    \n", "no hosts");
  expect_error("# only a comment\n", "no hosts");
}

TEST(Hostfile, MissingFileMeansNoHostfile) {
  EXPECT_FALSE(read_hostfile("/nonexistent/dscpp/hostfile").has_value());
}

TEST(Hostfile, ReadsFromDisk) {
  char path[] = "/tmp/dscpp_hostfile_XXXXXX";
  const int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  ::close(fd);
  std::ofstream(path) << "node-a slots=2\nnode-b slots=3\n";
  EXPECT_EQ(read_hostfile(path), (ResourcePool{{"node-a", 2}, {"node-b", 3}}));
  std::ofstream(path) << "node-a slots=2\nnode-a slots=3\n";
  EXPECT_THROW(read_hostfile(path), HostfileError);
  std::remove(path);
}

}  // namespace
}  // namespace dscpp::launcher
