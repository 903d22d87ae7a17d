#include "source/file_list.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include "testing/source_test_util.h"

namespace stoker {
namespace {

using testing::AsString;
using testing::TempDir;
using testing::WriteFile;

TEST(FileListTest, ReadsPathsAndLabels) {
  TempDir dir;
  TempDir elsewhere;
  ASSERT_TRUE(WriteFile(dir / "images/a.jpg", "A"));
  ASSERT_TRUE(WriteFile(dir / "images/with space\tand tab.jpg", "B"));
  ASSERT_TRUE(WriteFile(elsewhere / "abs.png", "C"));
  ASSERT_TRUE(WriteFile(dir / "images/\xff.jpg", "D"));
  const std::string list = dir / "lists/train.txt";
  ASSERT_TRUE(WriteFile(list,
                        "../images/a.jpg\t3\r\n"
                        "\n"
                        "../images/with space\tand tab.jpg\t 7 \t\n" +  // spaces, a tab after
                            elsewhere / "abs.png" +
                            "\t0\t\n" + "../images/\xff.jpg\t9223372036854775807"));
  auto source = OpenFileList(list);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 4);
  EXPECT_TRUE((*source)->ClassNames().empty());
  EXPECT_EQ((*source)->Key(0), dir / "lists/../images/a.jpg");
  EXPECT_EQ((*source)->Key(2), elsewhere / "abs.png");
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"A", 3}, {"B", 7}, {"C", 0}, {"D", INT64_MAX}};
  ReadBuffer buffer;
  for (int64_t i = 0; i < 4; ++i) {
    Record record;
    Status s = (*source)->Read(i, buffer, &record);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(AsString(record.bytes), expected[i].first);
    EXPECT_EQ(record.label, expected[i].second);
  }
}

TEST(FileListTest, ListInTheWorkingDirectoryResolvesAgainstIt) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "x.jpg", "X"));
  ASSERT_TRUE(WriteFile(dir / "list.tsv", "x.jpg\t1\n"));
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  auto source = OpenFileList("list.tsv");
  ASSERT_EQ(::chdir(cwd), 0);  // the source holds the folder, not the name
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ((*source)->Key(0), "x.jpg");
  ReadBuffer buffer;
  Record record;
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "X");
}

// Opens a list holding `text` and returns the error it gives.
Status OpenError(const TempDir& dir, const std::string& text) {
  const std::string list = dir / "bad.txt";
  WriteFile(list, text);
  auto source = OpenFileList(list);
  return source.ok() ? Status::Ok() : source.status();
}

TEST(FileListTest, BadLinesAreErrorsNamingFileAndLine) {
  TempDir dir;
  const std::string list = dir / "bad.txt";
  Status s = OpenError(dir, "a.jpg\t1\nb.jpg 2\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(list + ":2:"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no tab"), std::string::npos) << s.message();

  s = OpenError(dir, "a.jpg\t1\n\nb.jpg\tcat\n");
  EXPECT_NE(s.message().find(list + ":3:"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'cat' is not an integer"), std::string::npos) << s.message();

  s = OpenError(dir, "a.jpg\t1x\n");
  EXPECT_NE(s.message().find(list + ":1:"), std::string::npos) << s.message();
  s = OpenError(dir, "a.jpg\t\n");
  EXPECT_NE(s.message().find("is not an integer"), std::string::npos) << s.message();
  s = OpenError(dir, "a.jpg\t99999999999999999999\n");
  EXPECT_NE(s.message().find("is out of range"), std::string::npos) << s.message();
  s = OpenError(dir, "\t4\n");
  EXPECT_NE(s.message().find("empty path"), std::string::npos) << s.message();
}

TEST(FileListTest, BinaryFileIsNamedAsNotAList) {
  // An image given where its folder or a list goes: said so, not "line 1 has no tab".
  TempDir dir;
  Status s = OpenError(dir, std::string("\xFF\xD8\xFF\xE0\0\x10JFIF\0\1\tab\n", 16));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(dir / "bad.txt"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("binary data"), std::string::npos) << s.message();
}

// Editors on Windows start a UTF-8 file with a byte-order mark; it is not
// part of the first path.
TEST(FileListTest, LeadingByteOrderMarkIsSkipped) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "a.jpg", "A"));
  ASSERT_TRUE(WriteFile(dir / "list.txt",
                        "\xEF\xBB\xBF"
                        "a.jpg\t2\r\n"));
  auto source = OpenFileList(dir / "list.txt");
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 1);
  EXPECT_EQ((*source)->Key(0), dir / "a.jpg");
  ReadBuffer buffer;
  Record record;
  Status s = (*source)->Read(0, buffer, &record);
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(AsString(record.bytes), "A");
  EXPECT_EQ(record.label, 2);
}

TEST(FileListTest, NegativeLabelIsAnErrorNamingFileAndLine) {
  TempDir dir;
  const std::string list = dir / "bad.txt";
  for (const char* label : {"-1", "-100"}) {
    Status s = OpenError(dir, std::string("a.jpg\t0\nb.jpg\t") + label + "\n");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << label;
    EXPECT_NE(s.message().find(list + ":2:"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find(std::string("'") + label + "' is negative"), std::string::npos)
        << s.message();
  }
}

TEST(FileListTest, EmptyOrMissingListIsAnError) {
  TempDir dir;
  Status s = OpenError(dir, "\n\n");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no entries"), std::string::npos) << s.message();

  auto missing = OpenFileList(dir / "absent.txt");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir / "absent.txt"), std::string::npos);
}

TEST(FileListTest, MissingFileFailsItsReadNamingThePath) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "here.jpg", "h"));
  ASSERT_TRUE(WriteFile(dir / "list.txt", "here.jpg\t0\ngone.jpg\t1\n"));
  auto source = OpenFileList(dir / "list.txt");
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ReadBuffer buffer;
  Record record;
  EXPECT_TRUE((*source)->Read(0, buffer, &record).ok());
  Status s = (*source)->Read(1, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find(dir / "gone.jpg"), std::string::npos) << s.message();
}

TEST(PathSourceTest, TakesTheListedSamplesInOrder) {
  TempDir dir;
  ASSERT_TRUE(WriteFile(dir / "b/x.jpg", "X"));
  ASSERT_TRUE(WriteFile(dir / "a/y.png", "Y"));
  auto source =
      MakePathSource({dir / "b/x.jpg", dir / "a/y.png", dir / "gone.jpg"}, {4, 1, 0}, {"a", "b"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 3);
  EXPECT_EQ((*source)->Key(1), dir / "a/y.png");
  EXPECT_EQ((*source)->ClassNames(), (std::vector<std::string>{"a", "b"}));
  ReadBuffer buffer;
  Record record;
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "X");
  EXPECT_EQ(record.label, 4);
  Status gone = (*source)->Read(2, buffer, &record);
  EXPECT_EQ(gone.code(), StatusCode::kNotFound);
  EXPECT_NE(gone.message().find(dir / "gone.jpg"), std::string::npos) << gone.message();
}

TEST(PathSourceTest, RefusesMismatchedOrEmptyLists) {
  EXPECT_EQ(MakePathSource({"a.jpg"}, {0, 1}, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(MakePathSource({}, {}, {}).status().code(), StatusCode::kInvalidArgument);
  auto empty = MakePathSource({"a.jpg", ""}, {0, 1}, {});
  EXPECT_NE(empty.status().message().find("path 1 is empty"), std::string::npos)
      << empty.status().message();
}

}  // namespace
}  // namespace stoker
