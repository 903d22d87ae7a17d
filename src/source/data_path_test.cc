#include <gtest/gtest.h>

#include "source/tar_shard.h"
#include "stoker/image_sources.h"
#include "testing/source_test_util.h"

namespace stoker {
namespace {

using testing::AsBytes;
using testing::TempDir;
using testing::WriteFile;

void WriteOneSampleShard(const std::string& path) {
  const std::string image = "img";
  const std::string label = "4";
  const std::vector<TarMember> members = {{"s.jpg", AsBytes(image)}, {"s.cls", AsBytes(label)}};
  ASSERT_TRUE(WriteTarShard(path, members).ok());
}

TEST(DataPathTest, AFolderIsAnImageFolder) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "cat/a.jpg", "A"));
  ASSERT_TRUE(WriteFile(dir / "dog/b.png", "B"));
  DataPathKind kind{};
  auto source = OpenDataPath(dir.path(), &kind);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ(kind, DataPathKind::kImageFolder);
  EXPECT_EQ((*source)->ClassNames(), (std::vector<std::string>{"cat", "dog"}));
}

TEST(DataPathTest, AFolderNamedLikeAShardIsStillAFolder) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "data.tar/cat/a.jpg", "A"));
  DataPathKind kind{};
  auto source = OpenDataPath(dir / "data.tar", &kind);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ(kind, DataPathKind::kImageFolder);
}

TEST(DataPathTest, ATarNameOrBracePatternIsShards) {
  TempDir dir;
  WriteOneSampleShard(dir / "shard-0.tar");
  WriteOneSampleShard(dir / "shard-1.tar");
  DataPathKind kind{};
  auto one = OpenDataPath(dir / "shard-0.tar", &kind);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ(kind, DataPathKind::kTarShards);
  EXPECT_EQ((*one)->size(), 1);
  kind = DataPathKind::kImageFolder;
  auto both = OpenDataPath(dir / "shard-{0..1}.tar", &kind);
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  EXPECT_EQ(kind, DataPathKind::kTarShards);
  EXPECT_EQ((*both)->size(), 2);
}

TEST(DataPathTest, ACompressedTarIsRefusedNamingItsCompressorHoweverShort) {
  // It was read as a list file: "holds binary data ... not a list".
  TempDir dir;
  for (const char* name : {"a.tar.gz", "b.tgz"}) {
    ASSERT_TRUE(WriteFile(dir / name, std::string("\x1f\x8b\x08\x00", 4)));
    DataPathKind kind{};
    auto source = OpenDataPath(dir / name, &kind);
    ASSERT_FALSE(source.ok()) << name;
    EXPECT_EQ(kind, DataPathKind::kTarShards);
    const std::string& message = source.status().message();
    EXPECT_NE(message.find("gzip-compressed file, not a tar"), std::string::npos) << message;
    EXPECT_NE(message.find(name), std::string::npos) << message;
  }
}

TEST(DataPathTest, ARegularFileIsAFileList) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "a.jpg", "A"));
  ASSERT_TRUE(WriteFile(dir / "train.txt", "a.jpg\t3\n"));
  DataPathKind kind{};
  auto source = OpenDataPath(dir / "train.txt", &kind);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ(kind, DataPathKind::kFileList);
  EXPECT_EQ((*source)->Key(0), dir / "a.jpg");
}

TEST(DataPathTest, AMissingPathIsNotFoundNamingIt) {
  TempDir dir;
  const std::string gone = dir / "nowhere";
  auto source = OpenDataPath(gone);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kNotFound);
  EXPECT_NE(source.status().message().find(gone), std::string::npos) << source.status().message();
  // A missing shard is OpenTarShards's error, which names the shard too.
  auto shard = OpenDataPath(dir / "gone.tar");
  ASSERT_FALSE(shard.ok());
  EXPECT_NE(shard.status().message().find(dir / "gone.tar"), std::string::npos)
      << shard.status().message();
}

TEST(DataPathTest, MissingDataPlaceNamesAPathOrAPatternThatNamesNothing) {
  TempDir dir;
  EXPECT_EQ(MissingDataPlace(dir / "nowhere"), dir / "nowhere");
  EXPECT_EQ(MissingDataPlace(dir.path()), "");
  // A pattern is there when one of its names is, in any folder of it.
  const std::string pattern = dir / "part{0..2}/s-{00..01}.tar";
  EXPECT_EQ(MissingDataPlace(pattern), pattern);
  ASSERT_TRUE(std::filesystem::create_directory(dir / "part2"));
  EXPECT_EQ(MissingDataPlace(pattern), pattern);  // its folder alone names no shard
  WriteOneSampleShard(dir / "part2/s-01.tar");
  EXPECT_EQ(MissingDataPlace(pattern), "");
  // One ExpandBraces refuses is the opener's to name.
  EXPECT_EQ(MissingDataPlace(dir / "s-{0..99999999}.tar"), "");
}

TEST(DataPathTest, NeitherFolderNorFileIsAnErrorNamingIt) {
  auto source = OpenDataPath("/dev/null");
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(source.status().message().find("/dev/null"), std::string::npos);
}

}  // namespace
}  // namespace stoker
