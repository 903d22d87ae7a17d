#include "source/tar_shard.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <tuple>

#include "testing/source_test_util.h"

namespace stoker {
namespace {

using testing::AsBytes;
using testing::AsString;
using testing::ReadFile;
using testing::TempDir;

// Views a string literal's bytes (without the terminating NUL); the literal
// outlives the view, unlike a temporary std::string.
template <size_t N>
std::span<const std::byte> Bytes(const char (&literal)[N]) {
  return std::as_bytes(std::span<const char>(literal, N - 1));
}
std::span<const std::byte> Bytes(const std::string& s) { return AsBytes(s); }

// A hand-made tar header (for formats the writer does not produce).
std::string RawHeader(const std::string& name, uint64_t size, char type,
                      const char* magic =
                          "ustar\0"
                          "00") {
  std::string h(512, '\0');
  std::memcpy(h.data(), name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h.data() + 100, 8, "%07o", 0644);
  std::snprintf(h.data() + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  h[156] = type;
  std::memcpy(h.data() + 257, magic, 8);
  std::memset(h.data() + 148, ' ', 8);
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  std::snprintf(h.data() + 148, 8, "%06o", sum);
  return h;
}

std::string Padded(std::string data) {
  data.resize((data.size() + 511) / 512 * 512, '\0');
  return data;
}

TEST(TarShardTest, ReaderReadsBackWhatWriterWrites) {
  TempDir dir;
  const std::string long_name = std::string(120, 'd') + "/" + std::string(90, 'f') + ".jpg";
  const std::string big(1000, 'x');
  std::vector<TarMember> members = {
      {"a.jpg", Bytes("hello")},  {"a.cls", Bytes("3")},
      {"empty.bin", {}},          {"sub/dir/big.png", Bytes(big)},
      {long_name, Bytes("long")}, {"b\xff\xfe.jpg", Bytes("latin1")},
  };
  const std::string path = dir / "shard.tar";
  ASSERT_TRUE(WriteTarShard(path, members).ok());
  const std::string file = ReadFile(path);
  EXPECT_EQ(file.size() % 512, 0u);
  EXPECT_EQ(file.substr(file.size() - 1024), std::string(1024, '\0'));

  auto entries = IndexTarBytes(Bytes(file), path);
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    const TarEntry& e = (*entries)[i];
    EXPECT_EQ(e.name, members[i].name);
    EXPECT_EQ(file.substr(e.offset, e.size), AsString(members[i].data));
  }
}

TEST(TarShardTest, WriterRejectsNamesUstarCannotHold) {
  TempDir dir;
  const std::string path = dir / "bad.tar";
  std::vector<TarMember> too_long = {{std::string(101, 'n'), Bytes("x")}};
  Status s = WriteTarShard(path, too_long);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("too long"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(path), std::string::npos) << s.message();
  struct stat st;
  EXPECT_NE(::stat(path.c_str(), &st), 0) << "partial shard left behind";

  std::vector<TarMember> empty_name = {{"", Bytes("x")}};
  EXPECT_EQ(WriteTarShard(path, empty_name).code(), StatusCode::kInvalidArgument);
}

TEST(TarShardTest, WriterReportsUnwritablePath) {
  TempDir dir;
  std::vector<TarMember> members = {{"a", Bytes("x")}};
  Status s = WriteTarShard(dir / "no/such/dir.tar", members);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no/such/dir.tar"), std::string::npos) << s.message();
}

TEST(TarShardTest, ReadsGnuLongNames) {
  const std::string name = std::string(150, 'g') + ".jpg";
  std::string tar = RawHeader("././@LongLink", name.size() + 1, 'L', "ustar  \0");
  tar += Padded(name + '\0');
  tar += RawHeader("././@LongLink", 6, 'K', "ustar  \0");  // a long link name between
  tar += Padded("link!");
  tar += RawHeader(name.substr(0, 100), 3, '0', "ustar  \0");
  tar += Padded("abc");
  tar += std::string(1024, '\0');
  auto entries = IndexTarBytes(Bytes(tar), "gnu.tar");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, name);
  EXPECT_EQ(tar.substr((*entries)[0].offset, 3), "abc");
}

TEST(TarShardTest, ReadsPaxPathAndSkipsDirectories) {
  const std::string name = std::string(130, 'p') + "/x.png";
  std::string record = " path=" + name + "\n";
  std::string len = std::to_string(record.size() + 3);
  record = len + record;
  ASSERT_EQ(record.size(), std::stoul(len));
  std::string tar = RawHeader("dir/", 0, '5');
  tar += RawHeader("PaxHeaders/x", record.size(), 'x');
  tar += Padded(record);
  tar += RawHeader("short", 2, '0');
  tar += Padded("hi");
  tar += std::string(512, '\0');  // one zero block ends it, as two do
  auto entries = IndexTarBytes(Bytes(tar), "pax.tar");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  ASSERT_EQ(entries->size(), 1u);
  EXPECT_EQ((*entries)[0].name, name);
}

TEST(TarShardTest, GarbageHeaderIsADataErrorNamingTheArchive) {
  std::string tar = RawHeader("a.jpg", 1, '0') + Padded("z");
  tar += std::string(512, 'G');
  auto entries = IndexTarBytes(Bytes(tar), "/data/shard-003.tar");
  ASSERT_FALSE(entries.ok());
  EXPECT_EQ(entries.status().code(), StatusCode::kDataError);
  EXPECT_NE(entries.status().message().find("/data/shard-003.tar"), std::string::npos);
  EXPECT_NE(entries.status().message().find("checksum"), std::string::npos);
  EXPECT_NE(entries.status().message().find("byte 1024"), std::string::npos)
      << entries.status().message();
}

TEST(TarShardTest, AShardCompressedWholeIsNamedByItsCompressor) {
  // A gzip member header (magic, deflate, no flags) and deflate bytes: what
  // `tar czf shard.tar.gz` begins with. Before, "bad tar header checksum".
  std::string gz("\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03", 10);
  gz += std::string(2000, '\x5a');
  auto entries = IndexTarBytes(Bytes(gz), "/data/shard-000.tar");
  ASSERT_FALSE(entries.ok());
  EXPECT_EQ(entries.status().code(), StatusCode::kDataError);
  EXPECT_EQ(entries.status().message(),
            "/data/shard-000.tar: a gzip-compressed file, not a tar: stoker reads uncompressed "
            "tar shards (decompress it first)");
  for (const auto& [head, kind] :
       std::vector<std::pair<std::string, std::string>>{{"BZh91AY&SY", "bzip2"},
                                                        {std::string("\xfd"
                                                                     "7zXZ\0\0\x04",
                                                                     8),
                                                         "xz"},
                                                        {"\x28\xb5\x2f\xfd\x04", "zstd"}}) {
    auto other = IndexTarBytes(Bytes(head + std::string(1024, 'q')), "s.tar");
    ASSERT_FALSE(other.ok());
    EXPECT_NE(other.status().message().find("a " + kind + "-compressed file"), std::string::npos)
        << other.status().message();
  }
  // Garbage that no compressor begins with is still a bad header.
  auto garbage = IndexTarBytes(Bytes(std::string(1024, 'G')), "g.tar");
  ASSERT_FALSE(garbage.ok());
  EXPECT_NE(garbage.status().message().find("checksum"), std::string::npos);
}

TEST(TarShardTest, TruncatedMemberIsADataError) {
  std::string tar = RawHeader("a.jpg", 5000, '0') + std::string(100, 'j');
  auto entries = IndexTarBytes(Bytes(tar), "cut.tar");
  ASSERT_FALSE(entries.ok());
  EXPECT_EQ(entries.status().code(), StatusCode::kDataError);
  EXPECT_NE(entries.status().message().find("truncated"), std::string::npos);
  EXPECT_NE(entries.status().message().find("a.jpg"), std::string::npos);

  std::string half_header = RawHeader("a.jpg", 0, '0').substr(0, 300);
  auto cut = IndexTarBytes(Bytes(half_header), "half.tar");
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.status().message().find("truncated"), std::string::npos);
}

TEST(TarShardTest, EndBlocksAloneHaveNoMembers) {
  const std::string tar(1024, '\0');
  auto entries = IndexTarBytes(Bytes(tar), "empty.tar");
  ASSERT_TRUE(entries.ok()) << entries.status().ToString();
  EXPECT_TRUE(entries->empty());
}

// A tar cut short where a member ends, or with its end blocks lost, reads
// like a smaller valid one; without the end-of-archive blocks it is refused,
// naming the archive and the last member it holds.
TEST(TarShardTest, ArchiveWithoutEndBlocksIsTruncated) {
  TempDir dir;
  const std::string path = dir / "cut.tar";
  const std::string big(700, 'b');
  std::vector<TarMember> members = {
      {"a.jpg", Bytes("image a")}, {"a.cls", Bytes("1")}, {"b.jpg", Bytes(big)}};
  ASSERT_TRUE(WriteTarShard(path, members).ok());
  const std::string whole = ReadFile(path);
  auto entries = IndexTarBytes(Bytes(whole), path);
  ASSERT_TRUE(entries.ok() && entries->size() == 3);
  const size_t after_a_cls = (*entries)[1].offset + 512;  // where b.jpg's header starts
  const size_t after_b = (*entries)[2].offset + 1024;     // b.jpg's data and padding
  const std::vector<std::pair<size_t, std::string>> cuts = {
      {0, "before any file member"},
      {after_a_cls, "after member 'a.cls'"},
      {(*entries)[2].offset + 900, "after member 'b.jpg'"},  // its padding cut
      {after_b, "after member 'b.jpg'"},                     // no end blocks at all
      {after_b + 300, "after member 'b.jpg'"},               // part of one
  };
  for (const auto& [size, said] : cuts) {
    auto cut = IndexTarBytes(Bytes(whole.substr(0, size)), path);
    ASSERT_FALSE(cut.ok()) << size;
    EXPECT_EQ(cut.status().code(), StatusCode::kDataError);
    const std::string& m = cut.status().message();
    EXPECT_NE(m.find(path + ": "), std::string::npos) << m;
    EXPECT_NE(m.find("truncated"), std::string::npos) << m;
    EXPECT_NE(m.find(said), std::string::npos) << m;
  }
  auto one_end_block = IndexTarBytes(Bytes(whole.substr(0, after_b + 512)), path);
  ASSERT_TRUE(one_end_block.ok()) << one_end_block.status().ToString();
  EXPECT_EQ(one_end_block->size(), 3u);
}

// Writes a shard of (member name, contents) pairs.
void WriteShard(const std::string& path,
                const std::vector<std::pair<std::string, std::string>>& files) {
  std::vector<TarMember> members;
  for (const auto& [name, data] : files) members.push_back({name, AsBytes(data)});
  ASSERT_TRUE(WriteTarShard(path, members).ok());
}

TEST(TarSourceTest, ReadsSamplesFromShardsByBracePattern) {
  TempDir dir;
  WriteShard(dir / "shard-08.tar", {{"s0.jpg", "img0"},
                                    {"s0.cls", "0\n"},
                                    {"s0.json", "{}"},
                                    {"dir/s1.seg.png", "seg"},  // key dir/s1, ext seg.png
                                    {"dir/s1.PNG", "img1"},
                                    {"dir/s1.cls", " 7 "}});
  WriteShard(dir / "shard-09.tar", {{"s2.cls", "2"}, {"s2.jpeg", "img2"}});
  WriteShard(dir / "shard-10.tar", {{"\xff\xfe.jpg", "img3"},
                                    {"\xff\xfe.cls",
                                     "\xEF\xBB\xBF"
                                     "4"}});
  auto source = OpenTarShards({dir / "shard-{08..10}.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 4);
  const std::vector<std::tuple<std::string, std::string, int64_t>> expected = {
      {dir / "shard-08.tar:s0.jpg", "img0", 0},
      {dir / "shard-08.tar:dir/s1.PNG", "img1", 7},
      {dir / "shard-09.tar:s2.jpeg", "img2", 2},
      {dir / "shard-10.tar:\xff\xfe.jpg", "img3", 4}};  // a byte-order mark is skipped
  ReadBuffer buffer;
  for (int64_t i = 0; i < 4; ++i) {
    Record record;
    Status s = (*source)->Read(i, buffer, &record);
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ((*source)->Key(i), std::get<0>(expected[i]));
    EXPECT_EQ(AsString(record.bytes), std::get<1>(expected[i]));
    EXPECT_EQ(record.label, std::get<2>(expected[i]));
    EXPECT_TRUE(record.bytes.data() >= buffer.bytes.data() &&
                record.bytes.data() + record.bytes.size() <=
                    buffer.bytes.data() + buffer.bytes.size())
        << "read into the worker's buffer";
  }
}

TEST(TarSourceTest, ListOfShardPaths) {
  TempDir dir;
  WriteShard(dir / "a.tar", {{"x.jpg", "a"}, {"x.cls", "1"}});
  WriteShard(dir / "b.tar", {{"x.jpg", "b"}, {"x.cls", "2"}});
  auto source = OpenTarShards({dir / "b.tar", dir / "a.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 2);
  EXPECT_EQ((*source)->Key(0), dir / "b.tar:x.jpg");
  EXPECT_EQ((*source)->Key(1), dir / "a.tar:x.jpg");
}

// A label next to its image is read with it in one go; one far from it (or
// before it) is read on its own. Both land in the worker's buffer.
TEST(TarSourceTest, LabelsNearAndFarFromTheirImages) {
  TempDir dir;
  const std::string filler(40000, 'f'), big(20000, 'b');
  WriteShard(dir / "s.tar", {{"near.cls", "1"},
                             {"near.jpg", "near image"},
                             {"far.jpg", big},
                             {"filler.txt", filler},
                             {"far.cls", " 2\n"},
                             {"after.png", "image first"},
                             {"after.cls", "3"}});
  auto source = OpenTarShards({dir / "s.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 3);
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"near image", 1}, {big, 2}, {"image first", 3}};
  ReadBuffer buffer;
  for (int round = 0; round < 2; ++round) {
    for (int64_t i = 0; i < 3; ++i) {
      Record record;
      Status s = (*source)->Read(i, buffer, &record);
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(AsString(record.bytes), expected[i].first) << i;
      EXPECT_EQ(record.label, expected[i].second) << i;
    }
  }
}

TEST(TarSourceTest, SampleOverTheReadCapIsRefusedUnreadNamingIt) {
  TempDir dir;
  WriteShard(dir / "s.tar", {{"big.jpg", std::string(5000, 'x')},
                             {"big.cls", "1"},
                             {"small.jpg", "i"},
                             {"small.cls", "2"}});
  auto source = OpenTarShards({dir / "s.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ReadBuffer buffer;
  buffer.cap.bytes = 1000;
  Record record;
  Status s = (*source)->Read(0, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_NE(s.message().find(dir / "s.tar:big.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("5001 bytes"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("cap of 1000 B"), std::string::npos) << s.message();
  EXPECT_EQ(buffer.bytes.capacity(), 0u) << "the sample was not read";
  ASSERT_TRUE((*source)->Read(1, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "i");
  EXPECT_LE(buffer.bytes.capacity(), 1000u);
}

TEST(TarSourceTest, MissingOrNonIntegerClsFailsTheReadNamingTheSample) {
  TempDir dir;
  WriteShard(dir / "s.tar", {{"ok.jpg", "i"},
                             {"ok.cls", "1"},
                             {"nolabel.jpg", "i"},
                             {"text.jpg", "i"},
                             {"text.cls", "cat"},
                             {"empty.jpg", "i"},
                             {"empty.cls", ""}});
  auto source = OpenTarShards({dir / "s.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 4);
  ReadBuffer buffer;
  Record record;
  EXPECT_TRUE((*source)->Read(0, buffer, &record).ok());
  Status s = (*source)->Read(1, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find(dir / "s.tar:nolabel.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("no .cls"), std::string::npos) << s.message();
  s = (*source)->Read(2, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find(dir / "s.tar:text.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("not an integer"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("'cat'"), std::string::npos) << s.message();
  EXPECT_EQ((*source)->Read(3, buffer, &record).code(), StatusCode::kDataError);
}

TEST(TarSourceTest, LabelWithoutADecodableImageIsASampleWhoseReadFailsNamingIt) {
  // a.webp + a.cls and a lone b.cls are samples stoker cannot decode: counted
  // and reported by name, never dropped unseen; c.json has no label: not a sample.
  TempDir dir;
  WriteShard(dir / "s.tar", {{"ok.jpg", "i"},
                             {"ok.cls", "1"},
                             {"a.webp", "w"},
                             {"a.cls", "2"},
                             {"b.cls", "3"},
                             {"c.json", "{}"}});
  auto source = OpenTarShards({dir / "s.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 3);
  ReadBuffer buffer;
  Record record;
  EXPECT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ((*source)->Key(1), dir / "s.tar:a.webp");
  EXPECT_EQ((*source)->Key(2), dir / "s.tar:b.cls");
  for (int64_t i : {1, 2}) {
    Status s = (*source)->Read(i, buffer, &record);
    EXPECT_EQ(s.code(), StatusCode::kDataError);
    EXPECT_NE(s.message().find((*source)->Key(i)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("no image stoker decodes (.jpg, .jpeg, .png)"), std::string::npos)
        << s.message();
  }
}

TEST(TarSourceTest, KeyOfOnlyOtherFieldsNamedLikeImagesIsASampleWhoseReadFailsNamingIt) {
  // img.004.jpg is field "004.jpg" of key "img" (WebDataset's split at the
  // first '.'): a key with no image and no label of its own is reported,
  // once, with the rule; labels are found whatever their case.
  TempDir dir;
  WriteShard(dir / "s.tar", {{"ok.jpg", "i"},
                             {"ok.CLS", "1"},
                             {"img.004.jpg", "j"},
                             {"img.004.cls", "2"},
                             {"img.005.jpg", "k"},
                             {"img.005.cls", "3"},
                             {"cap.txt", "words"}});
  auto source = OpenTarShards({dir / "s.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 2);
  ReadBuffer buffer;
  Record record;
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(record.label, 1);
  EXPECT_EQ((*source)->Key(1), dir / "s.tar:img.004.jpg");
  Status s = (*source)->Read(1, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find(dir / "s.tar:img.004.jpg: its sample key 'img' has no image"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("first '.'"), std::string::npos) << s.message();
  // A shard of such keys alone has no sample to read: refused, saying why.
  WriteShard(dir / "only.tar", {{"img.004.jpg", "j"}, {"img.cls", "2"}});
  auto only = OpenTarShards({dir / "only.tar"});
  ASSERT_FALSE(only.ok());
  EXPECT_NE(only.status().message().find("'img.004.jpg' is a member of sample key 'img'"),
            std::string::npos)
      << only.status().message();
}

TEST(TarSourceTest, NegativeLabelFailsTheReadNamingTheMember) {
  TempDir dir;
  WriteShard(dir / "s.tar", {{"a.jpg", "i"}, {"a.cls", "-1"}, {"b.jpg", "i"}, {"b.cls", "-100\n"}});
  auto source = OpenTarShards({dir / "s.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ReadBuffer buffer;
  Record record;
  for (int64_t i = 0; i < 2; ++i) {
    Status s = (*source)->Read(i, buffer, &record);
    EXPECT_EQ(s.code(), StatusCode::kDataError) << i;
    const std::string key = i == 0 ? "a" : "b";
    EXPECT_NE(s.message().find(dir / "s.tar:" + key + ".jpg: member '" + key + ".cls'"),
              std::string::npos)
        << s.message();
    EXPECT_NE(s.message().find(i == 0 ? "'-1' is negative" : "'-100' is negative"),
              std::string::npos)
        << s.message();
  }
}

// One key with two images or two labels: a member written twice, or two
// images of one sample. Keeping one would drop the other silently.
TEST(TarSourceTest, DuplicateSampleKeyIsAnOpenErrorNamingShardAndKey) {
  TempDir dir;
  const std::string path = dir / "dup.tar";
  const std::vector<std::pair<std::vector<std::pair<std::string, std::string>>, std::string>>
      cases = {
          {{{"a.jpg", "1"}, {"a.cls", "1"}, {"k/b.jpg", "2"}, {"k/b.cls", "2"}, {"k/b.jpg", "3"}},
           "duplicate sample key 'k/b': member 'k/b.jpg' appears twice"},
          {{{"a.jpg", "1"}, {"a.cls", "1"}, {"a.cls", "2"}},
           "duplicate sample key 'a': member 'a.cls' appears twice"},
          {{{"a.jpg", "1"}, {"a.PNG", "2"}, {"a.cls", "1"}},
           "duplicate sample key 'a': two images, 'a.jpg' and 'a.PNG'"},
          {{{"a.jpg", "1"}, {"a.cls", "1"}, {"a.CLS", "2"}},
           "duplicate sample key 'a': two labels, 'a.cls' and 'a.CLS' (a sample's key "
           "ends at the first '.'"},
      };
  for (const auto& [members, said] : cases) {
    WriteShard(path, members);
    auto source = OpenTarShards({path});
    ASSERT_FALSE(source.ok()) << said;
    EXPECT_EQ(source.status().code(), StatusCode::kDataError);
    EXPECT_NE(source.status().message().find(path + ": " + said), std::string::npos)
        << source.status().message();
  }
  // The same key in two shards is two samples.
  WriteShard(dir / "one.tar", {{"a.jpg", "1"}, {"a.cls", "1"}});
  WriteShard(dir / "two.tar", {{"a.jpg", "2"}, {"a.cls", "2"}});
  auto source = OpenTarShards({dir / "one.tar", dir / "two.tar"});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ((*source)->size(), 2);
}

TEST(TarSourceTest, ShardCutAtAMemberBoundaryIsAnOpenErrorNamingIt) {
  TempDir dir;
  const std::string path = dir / "cut.tar";
  WriteShard(path, {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"b.cls", "2"}});
  ASSERT_EQ(::truncate(path.c_str(), 512 * 4), 0);  // a's two members, nothing after
  auto source = OpenTarShards({path});
  ASSERT_FALSE(source.ok()) << "read " << (*source)->size() << " samples of a cut shard";
  EXPECT_EQ(source.status().code(), StatusCode::kDataError);
  EXPECT_NE(source.status().message().find(path + ": truncated"), std::string::npos)
      << source.status().message();
  EXPECT_NE(source.status().message().find("after member 'a.cls'"), std::string::npos)
      << source.status().message();
}

TEST(TarSourceTest, TruncatedShardIsAnOpenErrorNamingIt) {
  TempDir dir;
  const std::string path = dir / "cut.tar";
  WriteShard(path, {{"a.jpg", std::string(3000, 'a')}, {"a.cls", "1"}});
  ASSERT_EQ(::truncate(path.c_str(), 512 + 1000), 0);
  auto source = OpenTarShards({path});
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kDataError);
  EXPECT_NE(source.status().message().find(path), std::string::npos);
  EXPECT_NE(source.status().message().find("truncated"), std::string::npos)
      << source.status().message();
}

// A shard cut short after it was indexed (rewritten or truncated in place
// while a loader reads it) fails the reads of the members it lost, naming
// the shard and the member; members it kept still read. No SIGBUS.
TEST(TarSourceTest, ShardTruncatedAfterOpeningFailsTheReadNamingTheMember) {
  TempDir dir;
  const std::string path = dir / "shrinks.tar";
  const std::string a(3000, 'a'), b(9000, 'b');
  WriteShard(path, {{"a.cls", "1"}, {"a.jpg", a}, {"b.cls", "2"}, {"b.jpg", b}});
  auto source = OpenTarShards({path});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), 2);
  // Keep the first 100 bytes of b.jpg's data.
  auto entries = IndexTarBytes(Bytes(ReadFile(path)), path);
  ASSERT_TRUE(entries.ok() && entries->size() == 4 && (*entries)[3].name == "b.jpg");
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>((*entries)[3].offset + 100)), 0);

  ReadBuffer buffer;
  Record record;
  Status s = (*source)->Read(1, buffer, &record);
  // (Touching bytes the file no longer has is where a mapping raised SIGBUS.)
  ASSERT_FALSE(s.ok()) << "read a cut member: "
                       << std::count(record.bytes.begin(), record.bytes.end(), std::byte{'b'})
                       << " of 9000 bytes are 'b'";
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  EXPECT_NE(s.message().find(path + ":b.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();

  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), a);
  EXPECT_EQ(record.label, 1);

  // Nothing left, not even the labels.
  ASSERT_EQ(::truncate(path.c_str(), 0), 0);
  for (int64_t i = 0; i < 2; ++i) {
    s = (*source)->Read(i, buffer, &record);
    EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
    EXPECT_NE(s.message().find((*source)->Key(i)), std::string::npos) << s.message();
  }
}

// A tar written over the shard in place (cp onto it: the same file, other
// bytes, another layout) fails the reads of members no longer where they
// were, saying so; it read the new bytes at the old offsets and blamed the
// data ("label 'E' is not an integer"). A shard appended to reads as before.
TEST(TarSourceTest, AShardWrittenOverInPlaceFailsItsMovedMembersSayingSo) {
  TempDir dir;
  const std::string path = dir / "shard.tar", other = dir / "other.tar";
  const std::string a(3000, 'a'), b(9000, 'b');
  WriteShard(path, {{"a.cls", "1"}, {"a.jpg", a}, {"b.cls", "2"}, {"b.jpg", b}});
  auto source = OpenTarShards({path});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  WriteShard(other, {{"longer-name-x.cls", "7"},
                     {"longer-name-x.jpg", std::string(700, 'x')},
                     {"y.cls", "8"},
                     {"y.jpg", std::string(20000, 'y')}});
  {
    // Rewritten through its descriptor as cp does: the inode stays.
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << ReadFile(other);
  }
  ReadBuffer buffer;
  Record record;
  for (int64_t i = 0; i < 2; ++i) {
    Status st = (*source)->Read(i, buffer, &record);
    ASSERT_FALSE(st.ok()) << "read sample " << i << " at its old place: label " << record.label;
    EXPECT_EQ(st.code(), StatusCode::kDataError) << st.ToString();
    EXPECT_NE(st.message().find((*source)->Key(i)), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("changed since it was opened"), std::string::npos) << st.message();
  }

  // Appended to (members after the old end): every member is where it was.
  WriteShard(path, {{"a.cls", "1"}, {"a.jpg", a}, {"b.cls", "2"}, {"b.jpg", b}});
  auto fresh = OpenTarShards({path});
  ASSERT_TRUE(fresh.ok()) << fresh.status().ToString();
  {
    std::string grown = ReadFile(path) + ReadFile(other);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << grown;
  }
  ASSERT_TRUE((*fresh)->Read(1, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), b);
  EXPECT_EQ(record.label, 2);
}

// Tar sources keep at most half the soft RLIMIT_NOFILE of shard files open
// (a WebDataset ImageNet has 1282 shards, the usual limit is 1024); shards
// past that are reopened for each read. Either way a read sees the shard the
// source indexed: a held one is read as it was even when another file is
// renamed over its path, a reopened one is then refused, never read with the
// old offsets.
TEST(TarSourceTest, ShardsPastTheDescriptorBudgetAreReopenedPerRead) {
  TempDir dir;
  constexpr int kShards = 40;
  auto shard = [&](int i) { return dir / std::string("s").append(std::to_string(i)) + ".tar"; };
  for (int i = 0; i < kShards; ++i) {
    WriteShard(shard(i), {{"x.cls", std::to_string(i)},
                          {"x.jpg", std::string("image ").append(std::to_string(i))}});
  }
  struct rlimit saved;
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = 32;  // room for 16 shards
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  auto source = OpenTarShards({dir / "s{0..39}.tar"});
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &saved), 0);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  ASSERT_EQ((*source)->size(), kShards);
  ReadBuffer buffer;
  Record record;
  for (int i = 0; i < kShards; ++i) {
    ASSERT_TRUE((*source)->Read(i, buffer, &record).ok()) << i;
    EXPECT_EQ(AsString(record.bytes), std::string("image ").append(std::to_string(i)));
    EXPECT_EQ(record.label, i);
  }

  for (int i : {0, kShards - 1}) {
    const std::string path = shard(i);
    WriteShard(path + ".new", {{"a-longer-name.cls", "7"}, {"a-longer-name.jpg", "other"}});
    ASSERT_EQ(::rename((path + ".new").c_str(), path.c_str()), 0);
  }
  ASSERT_TRUE((*source)->Read(0, buffer, &record).ok());
  EXPECT_EQ(AsString(record.bytes), "image 0");
  Status s = (*source)->Read(kShards - 1, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  EXPECT_NE(s.message().find(dir / "s39.tar:x.jpg"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("replaced"), std::string::npos) << s.message();

  ASSERT_EQ(::truncate((dir / "s38.tar").c_str(), 700), 0);
  s = (*source)->Read(kShards - 2, buffer, &record);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  EXPECT_NE(s.message().find(dir / "s38.tar:x.jpg: truncated"), std::string::npos) << s.message();
}

TEST(TarSourceTest, GarbageHeaderIsAnOpenErrorNamingIt) {
  TempDir dir;
  const std::string path = dir / "garbage.tar";
  WriteShard(path, {{"a.jpg", "a"}, {"a.cls", "1"}});
  std::string bytes = ReadFile(path);
  bytes[512 * 2 + 10] ^= 0x55;  // inside the second member's header
  ASSERT_TRUE(testing::WriteFile(path, bytes));
  auto source = OpenTarShards({path});
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kDataError);
  EXPECT_NE(source.status().message().find(path + ": at byte 1024"), std::string::npos)
      << source.status().message();
  EXPECT_NE(source.status().message().find("checksum"), std::string::npos);

  ASSERT_TRUE(testing::WriteFile(path, std::string(2048, 'x')));
  EXPECT_EQ(OpenTarShards({path}).status().code(), StatusCode::kDataError);
}

TEST(TarSourceTest, MissingShardAndNoImagesAreErrors) {
  TempDir dir;
  auto missing = OpenTarShards({dir / "none-{0..1}.tar"});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir / "none-0.tar"), std::string::npos)
      << missing.status().message();

  WriteShard(dir / "labels.tar", {{"a.cls", "1"}, {"a.txt", "caption"}});
  auto no_images = OpenTarShards({dir / "labels.tar"});
  ASSERT_FALSE(no_images.ok());
  EXPECT_EQ(no_images.status().code(), StatusCode::kNotFound);
  EXPECT_NE(no_images.status().message().find("no image"), std::string::npos);

  EXPECT_EQ(OpenTarShards({}).status().code(), StatusCode::kInvalidArgument);
}

TEST(TarSourceTest, AShardNamedTwiceIsRefusedNamingIt) {
  // By a pattern, by two entries, or by two spellings of one path: reading
  // it twice would deliver each of its samples twice.
  TempDir dir;
  WriteShard(dir / "s-0.tar", {{"a.jpg", "1"}, {"a.cls", "1"}});
  WriteShard(dir / "s-1.tar", {{"b.jpg", "2"}, {"b.cls", "2"}});
  const std::string spelled = dir / "./s-1.tar";
  for (const std::vector<std::string>& given :
       {std::vector<std::string>{dir / "s-{0,1,1}.tar"},
        std::vector<std::string>{dir / "s-{0..1}.tar", dir / "s-1.tar"},
        std::vector<std::string>{dir / "s-1.tar", spelled}}) {
    auto source = OpenTarShards(given);
    ASSERT_FALSE(source.ok()) << given.front();
    EXPECT_EQ(source.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(source.status().message().find("s-1.tar is named twice"), std::string::npos)
        << source.status().message();
  }
  auto both = ExpandShards({dir / "s-0.tar", dir / "s-1.tar"});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(*both, (std::vector<std::string>{dir / "s-0.tar", dir / "s-1.tar"}));
}

TEST(TarSourceTest, AShardNamedTwiceThroughALinkIsRefused) {
  // A symlinked folder or a hard link names the same file by another path
  // (so does a relative path beside an absolute one): its samples came twice.
  TempDir dir;
  WriteShard(dir / "s-0.tar", {{"a.jpg", "1"}, {"a.cls", "1"}});
  std::filesystem::create_directory_symlink(dir.path(), dir / "link");
  std::filesystem::create_hard_link(dir / "s-0.tar", dir / "hard.tar");
  for (const std::string& other : {dir / "link/s-0.tar", dir / "hard.tar"}) {
    auto source = OpenTarShards({dir / "s-0.tar", other});
    ASSERT_FALSE(source.ok()) << other;
    EXPECT_EQ(source.status().message().find("tar shard " + other + " is named twice (also as " +
                                             (dir / "s-0.tar") + ")"),
              0u)
        << source.status().message();
  }
}

TEST(TarSourceTest, SampleKeys) {
  EXPECT_EQ(SplitSampleKey("a/b.c/n01.seg.png"),
            (std::pair<std::string_view, std::string_view>("a/b.c/n01", "seg.png")));
  EXPECT_EQ(SplitSampleKey("plain"), (std::pair<std::string_view, std::string_view>("plain", "")));
}

// What a stream of one shard gave: per sample its key, bytes and label, or
// the error's code and message; the last entry is an error or "end".
struct StreamItem {
  std::string key, bytes;
  int64_t label = -1;
  Status error;
  bool broken = false;  // the reader's broken() after the call
};

std::vector<StreamItem> ReadStream(const std::string& path, size_t max_calls = 100) {
  std::vector<StreamItem> items;
  auto reader = TarShardReader::Open(path);
  if (!reader.ok()) return {StreamItem{"", "", -1, reader.status()}};
  TarStreamSample sample;
  for (size_t i = 0; i < max_calls; ++i) {
    Result<bool> more = (*reader)->Next(&sample);
    if (more.ok() && !*more) break;
    if (!more.ok()) {
      items.push_back({"", "", -1, more.status(), (*reader)->broken()});
    } else {
      items.push_back(
          {sample.key, AsString(sample.image), sample.label, Status::Ok(), (*reader)->broken()});
    }
  }
  return items;
}

// The stream of a shard is the shard's samples in the source: same keys,
// bytes and labels in the same order, whatever the members' order.
TEST(TarStreamTest, GivesTheSourcesSamplesInOrder) {
  TempDir dir;
  const std::string path = dir / "s.tar";
  const std::string big(40000, 'b');
  WriteShard(path, {{"near.cls", "1"},
                    {"near.jpg", "near image"},
                    {"apart.jpg", "apart"},  // its label comes after another sample
                    {"far.jpg", big},
                    {"filler.txt", std::string(40000, 'f')},
                    {"far.cls", " 2\n"},
                    {"apart.cls", "5"},
                    {"dir/s1.seg.png", "seg"},
                    {"dir/s1.PNG", "img1"},
                    {"dir/s1.cls",
                     "\xEF\xBB\xBF"
                     "7"},
                    {"caption.txt", "not a sample"}});
  auto source = OpenTarShards({path});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const std::vector<StreamItem> items = ReadStream(path);
  ASSERT_EQ(static_cast<int64_t>(items.size()), (*source)->size());
  ReadBuffer buffer;
  for (int64_t i = 0; i < (*source)->size(); ++i) {
    Record record;
    ASSERT_TRUE((*source)->Read(i, buffer, &record).ok());
    ASSERT_TRUE(items[i].error.ok()) << items[i].error.ToString();
    EXPECT_EQ(items[i].key, (*source)->Key(i));
    EXPECT_EQ(items[i].bytes, AsString(record.bytes)) << i;
    EXPECT_EQ(items[i].label, record.label) << i;
  }
  EXPECT_EQ(items[1].key, path + ":apart.jpg");
  EXPECT_EQ(items[1].label, 5);
}

// A sample that cannot be read is an error naming its key, as the source's
// Read of it; the stream goes on with the next sample.
TEST(TarStreamTest, SampleErrorsNameTheKeyAndTheStreamGoesOn) {
  TempDir dir;
  const std::string path = dir / "s.tar";
  WriteShard(path, {{"nolabel.jpg", "i"},
                    {"ok.jpg", "ok"},
                    {"ok.cls", "1"},
                    {"text.jpg", "i"},
                    {"text.cls", "cat"},
                    {"a.webp", "w"},
                    {"a.cls", "2"},
                    {"last.jpg", "last"},
                    {"last.cls", "3"}});
  auto source = OpenTarShards({path});
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  const std::vector<StreamItem> items = ReadStream(path);
  ASSERT_EQ(items.size(), 5u);
  ReadBuffer buffer;
  for (int64_t i = 0; i < 5; ++i) {
    Record record;
    Status read = (*source)->Read(i, buffer, &record);
    EXPECT_EQ(items[i].error.code(), read.code()) << i;
    EXPECT_EQ(items[i].error.message(), read.message()) << i;
  }
  EXPECT_NE(items[0].error.message().find(path + ":nolabel.jpg: sample has no .cls"),
            std::string::npos)
      << items[0].error.message();
  EXPECT_NE(items[2].error.message().find(path + ":text.jpg: member 'text.cls'"), std::string::npos)
      << items[2].error.message();
  EXPECT_NE(items[3].error.message().find(path + ":a.webp: sample has a label but no image"),
            std::string::npos)
      << items[3].error.message();
  EXPECT_EQ(items[1].bytes, "ok");
  EXPECT_EQ(items[4].bytes, "last");
  EXPECT_EQ(items[4].label, 3);
  for (const StreamItem& item : items) EXPECT_FALSE(item.broken);  // one sample's errors
}

// An error of the archive ends the stream after the samples before it; every
// later call says it again. OpenTarShards refuses such a shard at open.
TEST(TarStreamTest, ArchiveErrorsEndTheStreamNamingTheShard) {
  TempDir dir;
  const std::string path = dir / "s.tar";
  auto expect_end = [&](const std::vector<StreamItem>& items, size_t samples,
                        const std::string& said) {
    ASSERT_GE(items.size(), samples + 2);
    for (size_t i = 0; i < samples; ++i) EXPECT_TRUE(items[i].error.ok() && !items[i].broken);
    for (size_t i = samples; i < items.size(); ++i) {
      EXPECT_TRUE(items[i].broken) << i;
      EXPECT_EQ(items[i].error.code(), StatusCode::kDataError);
      EXPECT_NE(items[i].error.message().find(said), std::string::npos) << items[i].error.message();
    }
    EXPECT_FALSE(OpenTarShards({path}).ok());
  };
  WriteShard(path, {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"b.cls", "2"}});
  ASSERT_EQ(::truncate(path.c_str(), 512 * 4), 0);  // a's two members, nothing after
  expect_end(ReadStream(path, 4), 1,
             path + ": truncated tar: it ends at byte 2048 after member 'a.cls'");

  WriteShard(path, {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", std::string(3000, 'b')}});
  ASSERT_EQ(::truncate(path.c_str(), 512 * 5 + 100), 0);  // inside b.jpg's data
  expect_end(ReadStream(path, 4), 1, path + ": at byte 2048: truncated tar member 'b.jpg'");

  WriteShard(path, {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"b.cls", "2"}});
  std::string bytes = ReadFile(path);
  bytes[512 * 4 + 10] ^= 0x55;  // b.jpg's header
  ASSERT_TRUE(testing::WriteFile(path, bytes));
  expect_end(ReadStream(path, 4), 1, path + ": at byte 2048: bad tar header checksum");

  WriteShard(path, {{"a.jpg", "a"}, {"a.cls", "1"}, {"b.jpg", "b"}, {"a.jpg", "again"}});
  expect_end(ReadStream(path, 4), 1,
             path + ": duplicate sample key 'a': member 'a.jpg' appears twice");
}

TEST(TarStreamTest, MissingShardAndShardsWithoutSamples) {
  TempDir dir;
  const std::vector<StreamItem> missing = ReadStream(dir / "none.tar");
  ASSERT_EQ(missing.size(), 1u);
  EXPECT_EQ(missing[0].error.code(), StatusCode::kNotFound);
  EXPECT_NE(missing[0].error.message().find(dir / "none.tar"), std::string::npos)
      << missing[0].error.message();
  EXPECT_EQ(ReadStream(dir.path()).at(0).error.code(), StatusCode::kInvalidArgument);

  WriteShard(dir / "empty.tar", {});
  EXPECT_TRUE(ReadStream(dir / "empty.tar").empty());
  WriteShard(dir / "captions.tar", {{"a.txt", "caption"}, {"a.json", "{}"}});
  EXPECT_TRUE(ReadStream(dir / "captions.tar").empty());
}

// The stream reads a sample's members when it hands the sample out: a shard
// cut short after opening fails the samples it lost, naming them.
TEST(TarStreamTest, ShardCutAfterOpeningFailsTheLostSamples) {
  TempDir dir;
  const std::string path = dir / "s.tar";
  WriteShard(path,
             {{"a.cls", "1"}, {"a.jpg", "a"}, {"b.cls", "2"}, {"b.jpg", std::string(9000, 'b')}});
  auto reader = TarShardReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  TarStreamSample sample;
  Result<bool> more = (*reader)->Next(&sample);
  ASSERT_TRUE(more.ok() && *more) << more.status().ToString();
  EXPECT_EQ(AsString(sample.image), "a");
  ASSERT_EQ(::truncate(path.c_str(), 512 * 7 + 100), 0);  // into b.jpg's data
  more = (*reader)->Next(&sample);
  ASSERT_FALSE(more.ok());
  EXPECT_EQ(more.status().code(), StatusCode::kDataError);
  EXPECT_NE(more.status().message().find(path + ":b.jpg: truncated"), std::string::npos)
      << more.status().message();
}

}  // namespace
}  // namespace stoker
