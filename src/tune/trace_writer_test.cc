#include "tune/trace_writer.h"

#include <gtest/gtest.h>
#include <unistd.h>

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
