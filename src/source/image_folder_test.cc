#include "source/image_folder.h"

#include <gtest/gtest.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <thread>

#include "testing/source_test_util.h"

namespace stoker {
namespace {

using testing::AsString;
using testing::RunAsNobody;
using testing::TempDir;
using testing::WriteFile;

// (key relative to the root, label) for every sample, in index order.
std::vector<std::pair<std::string, int64_t>> Listing(const Source& source,
                                                     const std::string& root) {
  std::vector<std::pair<std::string, int64_t>> out;
  ReadBuffer buffer;
  for (int64_t i = 0; i < source.size(); ++i) {
    Record record;
    Status s = source.Read(i, buffer, &record);
    EXPECT_TRUE(s.ok()) << s.ToString();
    std::string key = source.Key(i);
    EXPECT_EQ(key.rfind(root + "/", 0), 0u) << key;
    out.emplace_back(key.substr(root.size() + 1), record.label);
  }
  return out;
}

TEST(ImageFolderTest, ClassesSortedAndNumberedLikeImageFolder) {
  TempDir dir;
  const std::string root = dir / "data";
  ASSERT_TRUE(WriteFile(root + "/dog/b.jpg", "dog b"));
  ASSERT_TRUE(WriteFile(root + "/dog/a.PNG", "dog a"));
  ASSERT_TRUE(WriteFile(root + "/dog/notes.txt", "not an image"));
  ASSERT_TRUE(WriteFile(root + "/cat/deep/er/c.jpeg", "cat c"));
  ASSERT_TRUE(WriteFile(root + "/cat/x.webp", "cat x"));
  ASSERT_TRUE(WriteFile(root + "/README.jpg", "files in the root are not samples"));

  auto source = OpenImageFolder(root + "/");  // trailing slash: same keys
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ((*source)->ClassNames(), (std::vector<std::string>{"cat", "dog"}));
  std::vector<std::pair<std::string, int64_t>> expected = {
      {"cat/x.webp", 0}, {"cat/deep/er/c.jpeg", 0}, {"dog/a.PNG", 1}, {"dog/b.jpg", 1}};
  EXPECT_EQ(Listing(**source, root), expected);

  ReadBuffer buffer;
  Record record;
  ASSERT_TRUE((*source)->Read(2, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "dog a");
}

TEST(ImageFolderTest, FoldersSortByWholePathLikeSortedOsWalk) {
  // sorted(os.walk()) orders "sub" < "sub-a" < "sub/x" ('-' < '/'), not the
  // depth-first "sub", "sub/x", "sub-a".
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "c/sub/1.jpg", ""));
  ASSERT_TRUE(WriteFile(dir / "c/sub/x/2.jpg", ""));
  ASSERT_TRUE(WriteFile(dir / "c/sub-a/3.jpg", ""));
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  std::vector<std::pair<std::string, int64_t>> expected = {
      {"c/sub/1.jpg", 0}, {"c/sub-a/3.jpg", 0}, {"c/sub/x/2.jpg", 0}};
  EXPECT_EQ(Listing(**source, dir.path()), expected);
}

TEST(ImageFolderTest, PythonNameOrder) {
  EXPECT_TRUE(PythonNameLess("a", "b"));
  EXPECT_TRUE(PythonNameLess("a", "ab"));
  EXPECT_FALSE(PythonNameLess("ab", "ab"));
  EXPECT_TRUE(PythonNameLess("B", "a"));
  // A lone 0xC3 byte decodes to U+DCC3, which sorts after U+00E9 ("é"),
  // although its bytes sort before "é"'s (0xC3 0xA9).
  EXPECT_TRUE(PythonNameLess("\xc3\xa9", "\xc3"));
  EXPECT_FALSE(PythonNameLess("\xc3", "\xc3\xa9"));
  // A surrogate escape (U+DC80..) sorts before U+E000..U+FFFF.
  EXPECT_TRUE(PythonNameLess("\xff", "\xee\x80\x80"));
  EXPECT_TRUE(PythonNameLess("\xee\x80\x80", "\xf0\x9f\x98\x80"));
}

TEST(ImageFolderTest, ImageExtensions) {
  for (const char* name : {"a.jpg", "b.JPEG", "c.Png", "d.ppm", "e.bmp", "f.pgm", "g.tif", "h.TIFF",
                           "i.webp", ".jpg"}) {
    EXPECT_TRUE(HasImageExtension(name)) << name;
  }
  for (const char* name : {"a.gif", "jpg", "a.jpg.txt", "a.jp", ""}) {
    EXPECT_FALSE(HasImageExtension(name)) << name;
  }
}

TEST(ImageFolderTest, NonUtf8NamesWorkAndKeysKeepTheirBytes) {
  TempDir dir;
  const std::string cls = "cl\xff\xfe";
  const std::string file = "\xe9t\xe9.jpg";  // latin-1 "été"
  ASSERT_TRUE(WriteFile(dir / (cls + "/" + file), "bytes"));
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 1);
  EXPECT_EQ((*source)->Key(0), dir / (cls + "/" + file));
  EXPECT_EQ((*source)->ClassNames(), std::vector<std::string>{cls});
  ReadBuffer buffer;
  Record record;
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "bytes");
}

TEST(ImageFolderTest, EmptyClassFolderIsAnErrorNamingIt) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "full/a.jpg", "x"));
  ASSERT_TRUE(WriteFile(dir / "hollow/readme.txt", "no images here"));
  auto source = OpenImageFolder(dir.path());
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kNotFound);
  EXPECT_NE(source.status().message().find("no valid image file"), std::string::npos);
  EXPECT_NE(source.status().message().find(dir / "hollow"), std::string::npos)
      << source.status().message();
  EXPECT_EQ(source.status().message().find(dir / "full"), std::string::npos);
}

TEST(ImageFolderTest, NoImagesAtAllIsAnError) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "loose.jpg", "x"));  // not in a class folder
  auto source = OpenImageFolder(dir.path());
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kNotFound);
  EXPECT_NE(source.status().message().find(dir.path()), std::string::npos);
  EXPECT_NE(source.status().message().find("no class folder"), std::string::npos);

  auto missing = OpenImageFolder(dir / "nowhere");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir / "nowhere"), std::string::npos);
}

TEST(ImageFolderTest, SymlinkLoopTerminatesAndListsEachImageOnce) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "c/a.jpg", "a"));
  ASSERT_TRUE(WriteFile(dir / "c/sub/b.jpg", "b"));
  ASSERT_EQ(::symlink("..", (dir / "c/sub/up").c_str()), 0);          // -> c
  ASSERT_EQ(::symlink(".", (dir / "c/self").c_str()), 0);             // -> c
  ASSERT_EQ(::symlink((dir / "c").c_str(), (dir / "d").c_str()), 0);  // class d -> c
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  std::vector<std::pair<std::string, int64_t>> expected = {
      {"c/a.jpg", 0}, {"c/sub/b.jpg", 0}, {"d/a.jpg", 1}, {"d/sub/b.jpg", 1}};
  EXPECT_EQ(Listing(**source, dir.path()), expected);
}

TEST(ImageFolderTest, ZeroByteFileReadsAsEmpty) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "c/empty.jpg", ""));
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ReadBuffer buffer;
  Record record;
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(record.bytes.size(), 0u);
}

// A file larger than the read cap (a worker's share of the memory budget)
// is refused from its size alone: a sparse 3 GiB ".jpg" costs no disk, and
// the buffer shows it was never read.
TEST(ImageFolderTest, FileOverTheReadCapIsRefusedUnreadNamingItsSizeAndTheCap) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "c/a_small.jpg", "small"));
  ASSERT_TRUE(WriteFile(dir / "c/huge.jpg", ""));
  ASSERT_EQ(::truncate((dir / "c/huge.jpg").c_str(), off_t{3} << 30), 0);
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ReadBuffer buffer;
  buffer.cap = {.bytes = 64u << 20, .budget_bytes = 256u << 20, .workers = 2};
  Record record;
  Status s = (*source)->Read(1, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  for (const std::string& part :
       {dir / "c/huge.jpg", std::string("3.0 GiB"), std::string("per-sample cap of 64.0 MiB"),
        std::string("memory budget of 256.0 MiB"), std::string("refused before reading")}) {
    EXPECT_NE(s.message().find(part), std::string::npos) << part << " in " << s.message();
  }
  EXPECT_EQ(buffer.bytes.capacity(), 0u) << "the file was not read";
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "small");
}

TEST(ImageFolderTest, FileRemovedAfterListingIsNotFoundNamingIt) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "c/a.jpg", "a"));
  ASSERT_TRUE(WriteFile(dir / "c/b.jpg", "b"));
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ(::unlink((dir / "c/b.jpg").c_str()), 0);
  ReadBuffer buffer;
  Record record;
  EXPECT_TRUE((*source)->Read(0, buffer, &record).ok());
  Status s = (*source)->Read(1, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(dir / "c/b.jpg"), std::string::npos) << s.message();
}

TEST(ImageFolderTest, UnreadableFileIsAnIoErrorNamingIt) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "c/locked.jpg", "secret"));
  ASSERT_EQ(::chmod((dir / "c/locked.jpg").c_str(), 0), 0);
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const std::string key = dir / "c/locked.jpg";
  auto attempt = [&] {
    ReadBuffer buffer;
    Record record;
    Status s = (*source)->Read(0, buffer, &record);
    if (s.ok()) return 1;
    if (s.code() != StatusCode::kIoError) return 2;
    if (s.message().find(key) == std::string::npos) return 3;
    if (s.message().find("Permission denied") == std::string::npos) return 4;
    return 0;
  };
  if (::geteuid() != 0) {
    EXPECT_EQ(attempt(), 0);
    return;
  }
  int code = RunAsNobody(attempt);
  if (code == -1) GTEST_SKIP() << "running as root and could not drop to user nobody (65534)";
  EXPECT_EQ(code, 0) << "1: read succeeded, 2: wrong code, 3: key missing, 4: reason missing";
}

TEST(ImageFolderTest, ConcurrentReadsShareOneSource) {
  TempDir dir;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(WriteFile(dir / ("c/" + std::to_string(i) + ".jpg"), std::to_string(i)));
  }
  auto source = OpenImageFolder(dir.path());
  ASSERT_TRUE(source.ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      ReadBuffer buffer;
      for (int64_t i = 0; i < (*source)->size(); ++i) {
        Record record;
        if (!(*source)->Read(i, buffer, &record).ok()) ++failures;
        if (dir / ("c/" + AsString(record.bytes) + ".jpg") != (*source)->Key(i)) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// Runs torchvision's ImageFolder over `root` and returns its samples as
// (hex of the path relative to root, label) lines, or nothing if python3 or
// torchvision is missing.
std::optional<std::vector<std::pair<std::string, int64_t>>> TorchvisionListing(
    const TempDir& scratch, const std::string& root) {
  if (::access("/usr/bin/python3", X_OK) != 0) return std::nullopt;
  if (std::system("/usr/bin/python3 -c 'import torchvision' >/dev/null 2>&1") != 0) {
    return std::nullopt;
  }
  const std::string script = scratch / "list.py";
  WriteFile(script,
            "import os, sys\n"
            "from torchvision.datasets import ImageFolder\n"
            "root = sys.argv[1]\n"
            "ds = ImageFolder(root)\n"
            "prefix = len(os.fsencode(root)) + 1\n"
            "for path, label in ds.samples:\n"
            "    print(os.fsencode(path)[prefix:].hex(), label)\n");
  const std::string command = "PYTHONUTF8=1 /usr/bin/python3 " + script + " '" + root + "'";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (pipe == nullptr) return std::nullopt;
  std::vector<std::pair<std::string, int64_t>> out;
  char hex[4096];
  long long label;
  while (std::fscanf(pipe, "%4095s %lld", hex, &label) == 2) {
    std::string bytes;
    for (size_t i = 0; hex[i] && hex[i + 1]; i += 2) {
      bytes.push_back(static_cast<char>(std::stoi(std::string(hex + i, 2), nullptr, 16)));
    }
    out.emplace_back(bytes, label);
  }
  EXPECT_EQ(::pclose(pipe), 0) << "the torchvision script failed";
  return out;
}

TEST(ImageFolderTest, LabelsAndOrderEqualTorchvisionImageFolder) {
  TempDir dir;
  const std::string root = dir / "tree";
  for (const char* path : {"zebra/1.jpg",
                           "Zebra/2.JPG",
                           "apple/sub/3.png",
                           "apple/sub-a/4.jpeg",
                           "apple/sub/x/5.bmp",
                           "apple/6.ppm",
                           "apple/7.txt",
                           "apple/8.pgm",
                           "apple/9.tif",
                           "apple/10.tiff",
                           "apple/11.webp",
                           "apple/12.gif",
                           ".hidden/13.jpg",
                           "caf\xc3\xa9/14.jpg",
                           "caf\xc3/15.jpg",
                           "caf\xc3/\xc3.jpg",
                           "caf\xc3/\xc3\xa9.jpg",
                           "\xff\xfe/16.jpg",
                           "m/a.jpg.bak",
                           "m/B.jpg",
                           "m/a.jpg",
                           "m/_.jpg",
                           "m/-.jpg",
                           "m/\xee\x80\x80.jpg",
                           "m/\xf0\x9f\x98\x80.jpg",
                           "m/\xed\xa0\x80.jpg"}) {
    ASSERT_TRUE(WriteFile(root + "/" + path, path));
  }
  ASSERT_EQ(::symlink((root + "/apple/sub").c_str(), (root + "/m/linked").c_str()), 0);
  ASSERT_EQ(::symlink((root + "/zebra").c_str(), (root + "/linked_class").c_str()), 0);

  auto expected = TorchvisionListing(dir, root);
  if (!expected) GTEST_SKIP() << "/usr/bin/python3 with torchvision is not available";
  ASSERT_FALSE(expected->empty());
  auto source = OpenImageFolder(root);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ(Listing(**source, root), *expected);
}

}  // namespace
}  // namespace stoker
