#include "tune/trace_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <csignal>
#include <fstream>
#include <string>
#include <vector>

namespace stoker {
namespace {

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "trace_writer_test_" + std::to_string(getpid()) + "_" + name;
}

std::vector<std::string> ReadLines(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(TraceWriterTest, AppendedLinesReachTheFileInOrder) {
  const std::string path = TempPath("order.jsonl");
  std::remove(path.c_str());
  std::vector<std::string> expected = {"kept from before"};
  std::ofstream(path) << expected[0] << "\n";
  {
    auto writer = TraceWriter::Open(path);
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (int i = 0; i < 5000; ++i) {
      expected.push_back("{\"line\": " + std::to_string(i) + "}");
      (*writer)->Append(expected.back());
    }
  }  // the destructor drains the queue
  EXPECT_EQ(ReadLines(path), expected);
  std::remove(path.c_str());
}

TEST(TraceWriterTest, NothingAppendedLeavesAnEmptyFile) {
  const std::string path = TempPath("empty.jsonl");
  std::remove(path.c_str());
  ASSERT_TRUE(TraceWriter::Open(path).ok());
  EXPECT_TRUE(ReadLines(path).empty());
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << "created at once";
  std::remove(path.c_str());
}

TEST(TraceWriterTest, UnwritablePathIsAnErrorNamingIt) {
  const std::string directory = ::testing::TempDir();
  const std::string missing = TempPath("no_such_dir") + "/trace.jsonl";
  for (const std::string& path : {directory, missing}) {
    auto writer = TraceWriter::Open(path);
    ASSERT_FALSE(writer.ok()) << path;
    EXPECT_NE(writer.status().message().find(path), std::string::npos)
        << writer.status().ToString();
  }
}

TEST(TraceWriterTest, FlushWaitsForTheLinesAppended) {
  const std::string path = TempPath("flush.jsonl");
  std::remove(path.c_str());
  auto writer = TraceWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  (*writer)->Append("one");
  (*writer)->Append("two");
  ASSERT_TRUE((*writer)->Flush().ok());
  EXPECT_EQ(ReadLines(path), (std::vector<std::string>{"one", "two"}));  // writer still open
  std::remove(path.c_str());
}

// A write the OS refuses (here a file size limit, as a full disk would) is
// kept for Flush, naming the file; before, the trace was silently short.
TEST(TraceWriterTest, AFailedWriteIsReturnedByFlushNamingTheFile) {
  const std::string path = TempPath("too_large.jsonl");
  std::remove(path.c_str());
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto writer = TraceWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  void (*saved_handler)(int) = std::signal(SIGXFSZ, SIG_IGN);  // EFBIG instead
  struct rlimit tiny = saved;
  tiny.rlim_cur = 8;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &tiny), 0);
  (*writer)->Append("a line longer than the eight bytes the file may hold");
  (*writer)->Append("and the next");
  const Status flushed = (*writer)->Flush();
  ::setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, saved_handler);
  ASSERT_FALSE(flushed.ok());
  EXPECT_NE(flushed.message().find(path), std::string::npos) << flushed.ToString();
  EXPECT_NE(flushed.message().find("File too large"), std::string::npos) << flushed.ToString();
  EXPECT_EQ((*writer)->Flush().ToString(), flushed.ToString()) << "kept, the first error";
  writer->reset();
  std::remove(path.c_str());
}

// A link planted where the trace goes (another user's, in a shared /tmp) is
// refused, and what it points to is left as it was.
TEST(TraceWriterTest, APlantedLinkIsRefusedAndItsTargetUntouched) {
  const std::string target = TempPath("target");
  const std::string symbolic = TempPath("symbolic.jsonl");
  const std::string hard = TempPath("hard.jsonl");
  for (const std::string& p : {target, symbolic, hard}) std::remove(p.c_str());
  std::ofstream(target) << "precious\n";
  ASSERT_EQ(::symlink(target.c_str(), symbolic.c_str()), 0);
  ASSERT_EQ(::link(target.c_str(), hard.c_str()), 0);
  for (const std::string& path : {symbolic, hard}) {
    auto writer = TraceWriter::Open(path);
    ASSERT_FALSE(writer.ok()) << path;
    EXPECT_NE(writer.status().message().find(path), std::string::npos)
        << writer.status().ToString();
  }
  EXPECT_EQ(ReadLines(target), std::vector<std::string>{"precious"});
  for (const std::string& p : {target, symbolic, hard}) std::remove(p.c_str());
}

}  // namespace
}  // namespace stoker
