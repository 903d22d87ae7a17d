#include "core/unique_fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>

#include "testing/source_test_util.h"

namespace stoker {
namespace {

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

int OpenNull() {
  const int fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  EXPECT_GE(fd, 0);
  return fd;
}

TEST(UniqueFdTest, ClosesOnDestruction) {
  const int fd = OpenNull();
  {
    UniqueFd owner(fd);
    EXPECT_EQ(owner.get(), fd);
    EXPECT_TRUE(owner.valid());
    EXPECT_TRUE(IsOpen(fd));
  }
  EXPECT_FALSE(IsOpen(fd));
}

TEST(UniqueFdTest, EmptyAndFailedOpenOwnNothing) {
  UniqueFd none;
  EXPECT_FALSE(none.valid());
  EXPECT_EQ(none.get(), -1);
  UniqueFd failed(::open("/nonexistent/stoker", O_RDONLY));
  EXPECT_FALSE(failed.valid());
  EXPECT_EQ(failed.Close(), 0);
}

TEST(UniqueFdTest, ReleaseGivesUpOwnership) {
  const int fd = OpenNull();
  {
    UniqueFd owner(fd);
    EXPECT_EQ(owner.release(), fd);
    EXPECT_FALSE(owner.valid());
  }
  EXPECT_TRUE(IsOpen(fd));
  ::close(fd);
}

TEST(UniqueFdTest, ResetClosesTheOldDescriptor) {
  const int first = OpenNull();
  const int second = OpenNull();
  UniqueFd owner(first);
  owner.reset(second);
  EXPECT_FALSE(IsOpen(first));
  EXPECT_EQ(owner.get(), second);
  owner.reset();
  EXPECT_FALSE(IsOpen(second));
  EXPECT_FALSE(owner.valid());
}

TEST(UniqueFdTest, MoveTransfersOwnership) {
  const int fd = OpenNull();
  UniqueFd a(fd);
  UniqueFd b(std::move(a));
  EXPECT_FALSE(a.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(b.get(), fd);
  const int other = OpenNull();
  UniqueFd c(other);
  c = std::move(b);  // closes `other`, takes `fd`
  EXPECT_FALSE(IsOpen(other));
  EXPECT_EQ(c.get(), fd);
  EXPECT_TRUE(IsOpen(fd));
}

TEST(UniqueFdTest, CloseReportsAndEmpties) {
  const int fd = OpenNull();
  UniqueFd owner(fd);
  EXPECT_EQ(owner.Close(), 0);
  EXPECT_FALSE(owner.valid());
  EXPECT_FALSE(IsOpen(fd));
}

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

TEST(ReplaceFileTest, WritesWholeThroughALinkAndLeavesNothingElse) {
  std::string dir = "/tmp/stoker-replace-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string plot = dir + "/plot.svg", link = dir + "/latest.svg";
  ASSERT_TRUE(ReplaceFile(plot, "first").ok());
  EXPECT_EQ(Read(plot), "first");
  ASSERT_EQ(::symlink("plot.svg", link.c_str()), 0);
  ASSERT_TRUE(ReplaceFile(link, "second").ok());
  EXPECT_EQ(Read(plot), "second");  // the file the link names; the link stays
  struct stat st;
  ASSERT_EQ(::lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            2);  // no file of the writing left beside them
  // A folder it cannot be renamed over: an error, the folder untouched.
  ASSERT_EQ(::mkdir((dir + "/taken").c_str(), 0755), 0);
  EXPECT_FALSE(ReplaceFile(dir + "/taken", "x").ok());
  EXPECT_FALSE(ReplaceFile(dir + "/missing/plot.svg", "x").ok());
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            3);
  std::filesystem::remove_all(dir);
}

TEST(CheckReplaceableTest, SaysBeforehandWhetherReplaceFileCanWrite) {
  std::string dir = "/tmp/stoker-replaceable-XXXXXX";
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  const std::string fresh = dir + "/fresh.svg", kept = dir + "/kept.svg";
  Result<bool> made = CheckReplaceable(fresh);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_TRUE(*made);  // an empty file the caller removes if the work fails
  EXPECT_EQ(Read(fresh), "");
  ASSERT_TRUE(ReplaceFile(kept, "old").ok());
  made = CheckReplaceable(kept);
  ASSERT_TRUE(made.ok());
  EXPECT_FALSE(*made);
  EXPECT_EQ(Read(kept), "old");  // untouched until replaced
  ASSERT_EQ(::mkfifo((dir + "/fifo").c_str(), 0644), 0);
  EXPECT_EQ(CheckReplaceable(dir + "/fifo").status().message(), "not a regular file");
  EXPECT_FALSE(CheckReplaceable(dir).ok());
  EXPECT_FALSE(CheckReplaceable(dir + "/missing/plot.svg").ok());
  // A file it may write in a folder that takes no new file: the rename
  // ReplaceFile needs would fail, so the check does, and leaves all as it was.
  ASSERT_EQ(::chmod(kept.c_str(), 0666), 0);
  ASSERT_EQ(::chmod(dir.c_str(), 0555), 0);
  auto attempt = [&] {
    Result<bool> r = CheckReplaceable(kept);
    if (r.ok()) return 1;
    if (r.status().message().find("create a file beside it") == std::string::npos) return 2;
    if (!CheckReplaceable(dir + "/new.svg").ok())
      return ::access((dir + "/new.svg").c_str(), F_OK) == 0 ? 4 : 0;
    return 3;
  };
  const int code = ::geteuid() != 0 ? attempt() : testing::RunAsNobody(attempt);
  ::chmod(dir.c_str(), 0755);
  EXPECT_EQ(Read(kept), "old");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()),
            3);  // fresh, kept, fifo: nothing of the checks left
  std::filesystem::remove_all(dir);
  if (code == -1) GTEST_SKIP() << "running as root and could not drop to user nobody (65534)";
  EXPECT_EQ(code, 0) << "1: passed, 2: reason missing, 3: a new file passed, 4: it was left";
}

}  // namespace
}  // namespace stoker
