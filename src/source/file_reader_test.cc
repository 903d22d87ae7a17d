#include "source/file_reader.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/unique_fd.h"
#include "testing/source_test_util.h"

namespace stoker {
namespace {

using testing::AsString;
using testing::RunAsNobody;
using testing::TempDir;
using testing::WriteFile;

TEST(FileReaderTest, ReadsWholeFileAndReusesTheBuffer) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "big", std::string(10000, 'b')));
  ASSERT_TRUE(WriteFile(dir / "small", "tiny"));
  ReadBuffer buffer;
  std::span<const std::byte> bytes;
  ASSERT_TRUE(ReadWholeFile(AT_FDCWD, (dir / "big").c_str(), buffer, &bytes).ok());
  EXPECT_EQ(AsString(bytes), std::string(10000, 'b'));
  const std::byte* storage = buffer.bytes.data();
  ASSERT_TRUE(ReadWholeFile(AT_FDCWD, (dir / "small").c_str(), buffer, &bytes).ok());
  EXPECT_EQ(AsString(bytes), "tiny");
  EXPECT_EQ(bytes.data(), storage) << "a warm buffer must not be reallocated";
}

TEST(FileReaderTest, ResolvesRelativePathsAgainstTheFolder) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "sub/f.jpg", "in sub"));
  UniqueFd fd(::open(dir.path().c_str(), O_PATH | O_DIRECTORY));
  ASSERT_TRUE(fd.valid());
  ReadBuffer buffer;
  std::span<const std::byte> bytes;
  EXPECT_TRUE(ReadWholeFile(fd.get(), "sub/f.jpg", buffer, &bytes).ok());
  EXPECT_EQ(AsString(bytes), "in sub");
}

TEST(FileReaderTest, ZeroByteFileReadsAsZeroBytes) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "empty.jpg", ""));
  ReadBuffer buffer;
  std::span<const std::byte> bytes;
  ASSERT_TRUE(ReadWholeFile(AT_FDCWD, (dir / "empty.jpg").c_str(), buffer, &bytes).ok());
  EXPECT_EQ(bytes.size(), 0u);
}

TEST(FileReaderTest, MissingFileIsNotFound) {
  TempDir dir;
  ReadBuffer buffer;
  std::span<const std::byte> bytes;
  Status s = ReadWholeFile(AT_FDCWD, (dir / "gone.jpg").c_str(), buffer, &bytes);
  EXPECT_EQ(s.code(), StatusCode::kNotFound) << s.ToString();
}

TEST(FileReaderTest, FolderAndFifoAreDataErrorsNotHangs) {
  TempDir dir;
  ASSERT_EQ(::mkdir((dir / "dir.jpg").c_str(), 0755), 0);
  ASSERT_EQ(::mkfifo((dir / "fifo.jpg").c_str(), 0644), 0);
  ReadBuffer buffer;
  std::span<const std::byte> bytes;
  Status s = ReadWholeFile(AT_FDCWD, (dir / "dir.jpg").c_str(), buffer, &bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  s = ReadWholeFile(AT_FDCWD, (dir / "fifo.jpg").c_str(), buffer, &bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  EXPECT_NE(s.message().find("regular"), std::string::npos);
}

TEST(FileReaderTest, UnreadableFileIsAnIoError) {
  TempDir dir;
  const std::string path = dir / "secret.jpg";
  ASSERT_TRUE(WriteFile(path, "x"));
  ASSERT_EQ(::chmod(path.c_str(), 0), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  auto attempt = [&] {
    ReadBuffer buffer;
    std::span<const std::byte> bytes;
    Status s = ReadWholeFile(AT_FDCWD, path.c_str(), buffer, &bytes);
    if (s.ok()) return 1;
    if (s.code() != StatusCode::kIoError) return 2;
    if (s.message().find("Permission denied") == std::string::npos) return 3;
    return 0;
  };
  if (::geteuid() != 0) {
    EXPECT_EQ(attempt(), 0);
    return;
  }
  int code = RunAsNobody(attempt);
  if (code == -1) GTEST_SKIP() << "running as root and could not drop to user nobody (65534)";
  EXPECT_EQ(code, 0) << "1: read succeeded, 2: wrong code, 3: reason not in message";
}

}  // namespace
}  // namespace stoker
