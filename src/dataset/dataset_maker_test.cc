#include "dataset/dataset_maker.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "source/tar_shard.h"
#include "testing/test_images.h"
#include "transform/jpeg_decoder.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "stoker-dataset-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void Write(const fs::path& path, const std::vector<uint8_t>& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> Read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

// A small stand-in for the wallpapers package: two themes, one JPEG (with a
// smaller size next to it that must be ignored) and one PNG.
std::string MakePhotos(const std::string& root) {
  const fs::path photos = fs::path(root) / "photos";
  Write(photos / "Alpha/contents/images/1600x1000.jpg",
        testing::Jpeg(testing::MakePicture(1600, 1000, 1), 1600, 1000));
  Write(photos / "Alpha/contents/images/320x200.jpg",
        testing::Jpeg(testing::MakePicture(320, 200, 1), 320, 200));
  Write(photos / "Beta/contents/images/900x760.png",
        testing::Png(testing::MakePicture(900, 760, 2), 900, 760, PNG_COLOR_TYPE_RGB, 8));
  Write(photos / "Beta/metadata.json", {'{', '}'});
  return photos.string();
}

std::map<std::string, std::vector<uint8_t>> ReadTree(const std::string& root) {
  std::map<std::string, std::vector<uint8_t>> files;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (e.is_regular_file() && e.path().filename() != kDatasetCompleteMarker) {
      files[fs::relative(e.path(), root).string()] = Read(e.path());
    }
  }
  return files;
}

TEST(DatasetMakerTest, FindsTheLargestPhotoOfEachFolder) {
  TempDir tmp;
  const std::string photos = MakePhotos(tmp.path());
  auto found = FindPhotos(photos);
  ASSERT_TRUE(found.ok()) << found.status().ToString();
  ASSERT_EQ(found->size(), 2u);
  EXPECT_EQ((*found)[0], photos + "/Alpha/contents/images/1600x1000.jpg");
  EXPECT_EQ((*found)[1], photos + "/Beta/contents/images/900x760.png");
  EXPECT_EQ(FindPhotos(tmp.path() + "/nothing").status().code(), StatusCode::kNotFound);
}

TEST(DatasetMakerTest, WritesClassFoldersDeterministically) {
  TempDir tmp;
  MakeDatasetOptions o;
  o.photos = MakePhotos(tmp.path());
  o.images = 24;
  o.classes = 3;
  o.seed = 11;
  o.output = tmp.path() + "/a";
  auto report = MakeDataset(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->images, 24);
  EXPECT_EQ(report->photos_used, 2);
  EXPECT_EQ(report->class_names, (std::vector<std::string>{"n000", "n001", "n002"}));
  EXPECT_GT(report->mean_pixels, 0.09e6);
  EXPECT_LT(report->mean_pixels, 0.41e6);

  auto files = ReadTree(o.output);
  ASSERT_EQ(files.size(), 24u);
  EXPECT_EQ(files.count("n000/n000_000000.jpg"), 1u);
  EXPECT_EQ(files.count("n002/n002_000023.jpg"), 1u);
  JpegDecoder dec;
  int64_t bytes = 0;
  for (const auto& [name, data] : files) {
    bytes += static_cast<int64_t>(data.size());
    ASSERT_TRUE(dec.ReadHeader(testing::AsBytes(data)).ok()) << name;
    EXPECT_GE(dec.width(), 300) << name;
    EXPECT_LE(dec.width(), 640) << name;
    const double aspect = static_cast<double>(dec.height()) / dec.width();
    EXPECT_GE(aspect, 0.6 - 0.01) << name;
    EXPECT_LE(aspect, 1.0 + 0.01) << name;
    std::vector<uint8_t> pixels;
    DecodedRegion r;
    EXPECT_TRUE(dec.DecodeFull(testing::AsBytes(data), 1, &pixels, &r).ok()) << name;
  }
  EXPECT_EQ(bytes, report->bytes);

  // Same seed: byte-identical. Another seed: different images.
  o.output = tmp.path() + "/b";
  ASSERT_TRUE(MakeDataset(o).ok());
  EXPECT_EQ(ReadTree(o.output), files);
  o.output = tmp.path() + "/c";
  o.seed = 12;
  ASSERT_TRUE(MakeDataset(o).ok());
  EXPECT_NE(ReadTree(o.output), files);
}

TEST(DatasetMakerTest, ShardsHoldTheSameImagesAndLabels) {
  TempDir tmp;
  MakeDatasetOptions o;
  o.photos = MakePhotos(tmp.path());
  o.images = 10;
  o.classes = 4;
  o.shards = 3;
  o.output = tmp.path() + "/out/";
  auto report = MakeDataset(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->shard_paths.size(), 3u);
  EXPECT_EQ(report->shard_paths[0], tmp.path() + "/out-shards/shard-000.tar");
  int images = 0;
  for (const std::string& shard : report->shard_paths) {
    std::vector<uint8_t> tar = Read(shard);
    auto entries = IndexTarBytes(testing::AsBytes(tar), shard);
    ASSERT_TRUE(entries.ok()) << entries.status().ToString();
    ASSERT_EQ(entries->size() % 2, 0u);
    for (size_t i = 0; i < entries->size(); i += 2) {
      const TarEntry& jpg = (*entries)[i];
      const TarEntry& cls = (*entries)[i + 1];
      ASSERT_EQ(jpg.name.substr(jpg.name.size() - 4), ".jpg");
      const std::string key = jpg.name.substr(0, jpg.name.size() - 4);
      EXPECT_EQ(cls.name, key + ".cls");
      const std::string class_name = key.substr(0, 4);
      std::string label(reinterpret_cast<const char*>(tar.data() + cls.offset), cls.size);
      EXPECT_EQ("n00" + label, class_name);
      std::vector<uint8_t> in_tar(tar.begin() + static_cast<ptrdiff_t>(jpg.offset),
                                  tar.begin() + static_cast<ptrdiff_t>(jpg.offset + jpg.size));
      EXPECT_EQ(in_tar, Read(tmp.path() + "/out/" + class_name + "/" + key + ".jpg")) << key;
      ++images;
    }
  }
  EXPECT_EQ(images, 10);
}

// Options for a small data set at tmp/<name>, cut from MakePhotos' stand-ins.
MakeDatasetOptions SmallDataset(const TempDir& tmp, const std::string& name, int64_t images,
                                int classes) {
  MakeDatasetOptions o;
  o.photos = MakePhotos(tmp.path());
  o.output = tmp.path() + "/" + name;
  o.images = images;
  o.classes = classes;
  return o;
}

// The names in `dir`, sorted.
std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// An interrupted run of an older stoker left files in OUT: a new run refuses
// it before any work rather than mixing them in (the run that reported 100
// images where 662 were), and leaves everything as it was.
TEST(DatasetMakerTest, AFolderWithOtherFilesIsRefusedNotMixedIn) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 4, 2);
  Write(fs::path(o.output) / "n000" / "n000_000561.jpg", {1, 2, 3});
  auto report = MakeDataset(o);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kFailedPrecondition);
  const std::string& m = report.status().message();
  EXPECT_NE(m.find(o.output + " is not empty and is not a complete data set"), std::string::npos)
      << m;
  EXPECT_NE(m.find("remove it or choose another folder"), std::string::npos) << m;
  EXPECT_EQ(ReadTree(o.output).size(), 1u);
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"out", "photos"}));

  // The shards' folder too, when shards are asked for.
  o.output = tmp.path() + "/other";
  o.shards = 2;
  Write(fs::path(tmp.path()) / "other-shards" / "shard-007.tar", {1});
  report = MakeDataset(o);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find(o.output + "-shards is not empty"), std::string::npos)
      << report.status().message();
  EXPECT_FALSE(fs::exists(o.output));
}

// A complete data set of an earlier run is replaced whole: a smaller run
// leaves exactly its own images and shards, and the report counts them.
TEST(DatasetMakerTest, AnEarlierDataSetIsReplacedWhole) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 12, 3);
  o.shards = 3;
  ASSERT_TRUE(MakeDataset(o).ok());
  EXPECT_EQ(ReadTree(o.output).size(), 12u);
  o.images = 5;
  o.classes = 2;
  o.shards = 2;
  auto report = MakeDataset(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(report->images, 5);
  EXPECT_EQ(ReadTree(o.output).size(), 5u);
  EXPECT_EQ(Names(o.output), (std::vector<std::string>{kDatasetCompleteMarker, "n000", "n001"}));
  EXPECT_EQ(Names(o.output + "-shards"),
            (std::vector<std::string>{kDatasetCompleteMarker, "shard-000.tar", "shard-001.tar"}));
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"out", "out-shards", "photos"}));

  // An empty folder is filled.
  o.output = tmp.path() + "/empty";
  fs::create_directory(o.output);
  o.shards = 0;
  ASSERT_TRUE(MakeDataset(o).ok());
  EXPECT_EQ(ReadTree(o.output).size(), 5u);
}

// A run that fails leaves nothing beside the output and the output as it was.
TEST(DatasetMakerTest, AFailedRunLeavesNothingBehind) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 6, 2);
  Write(fs::path(o.photos) / "Gamma/contents/images/broken.jpg", {0xff, 0xd8, 0xff, 0xe0, 1});
  auto report = MakeDataset(o);
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find("broken.jpg"), std::string::npos)
      << report.status().message();
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"photos"}));
}

// Stopped (Ctrl-C in the CLI) between images: nothing left beside the output.
TEST(DatasetMakerTest, AStoppedRunLeavesNothingBehind) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 6, 2);
  o.shards = 2;
  int asked = 0;
  o.stop = [&asked] { return ++asked > 3; };
  auto report = MakeDataset(o);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"photos"}));
}

// The id of a process that has just ended (its id free), or -1.
pid_t GoneProcessId() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  if (child < 0 || ::waitpid(child, nullptr, 0) != child) return -1;
  return child;
}

// The folders it made above the output go too (they stayed, empty).
TEST(DatasetMakerTest, AStoppedRunRemovesTheFoldersItMadeAboveTheOutput) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "new/a/out", 6, 2);
  fs::create_directory(tmp.path() + "/kept");
  int asked = 0;
  o.stop = [&asked] { return ++asked > 3; };
  ASSERT_EQ(MakeDataset(o).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"kept", "photos"}));
  o.output = tmp.path() + "/kept/b/out";
  asked = 0;
  ASSERT_EQ(MakeDataset(o).status().code(), StatusCode::kCancelled);
  EXPECT_EQ(Names(tmp.path() + "/kept"), std::vector<std::string>{});
}

// What a killed run left (its process gone) goes with the next run beside
// it; a live process's half-made folder stays.
TEST(DatasetMakerTest, ARunRemovesTheHalfMadeFoldersOfProcessesThatAreGone) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 4, 2);
  const pid_t child = GoneProcessId();
  ASSERT_GT(child, 0);
  const std::string dead = o.output + ".making-" + std::to_string(child);
  const std::string live = o.output + ".making-" + std::to_string(::getppid());
  for (const std::string& dir : {dead, dead + "-shards", live}) Write(fs::path(dir) / "x.jpg", {1});
  Write(fs::path(o.output + ".making-007") / "x.jpg", {1});  // not a process id as written
  ASSERT_TRUE(MakeDataset(o).ok());
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_FALSE(fs::exists(dead + "-shards"));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(o.output + ".making-007"));
}

// The built-in data set's placement: made in one `out.making-<pid>` beside
// the output (it was `out.making-<pid>.making-<pid>`, which no later run
// removed), an older layout there replaced; a complete data set found when
// done (another process's) kept, the one made dropped.
TEST(DatasetMakerTest, KeepCompletePlacementMakesBesideAndKeepsAComplete) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 4, 2);
  Write(fs::path(o.output) / "n003" / "old-layout.jpg", {1});
  std::vector<std::string> seen;
  o.stop = [&] {
    if (seen.empty()) seen = Names(tmp.path());
    return false;
  };
  ASSERT_TRUE(MakeDatasetAt(o, Placement::kKeepComplete).ok());
  const std::string making = "out.making-" + std::to_string(::getpid());
  EXPECT_EQ(seen, (std::vector<std::string>{"out", making, "photos"}));
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"out", "photos"}));
  EXPECT_EQ(ReadTree(o.output).size(), 4u);  // no old-layout.jpg

  Write(fs::path(o.output) / "theirs.jpg", {2});  // another process's, complete
  o.images = 2;
  ASSERT_TRUE(MakeDatasetAt(o, Placement::kKeepComplete).ok());
  EXPECT_EQ(ReadTree(o.output).size(), 5u);
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"out", "photos"}));
}

// An empty folder named with a last "." (`make-dataset .` in it): made
// beside it, not inside it (the run refused its own making folder there and
// left `.-shards` behind), and filled in place, so that it is still the
// folder the caller's shell is in.
TEST(DatasetMakerTest, AnEmptyFolderNamedByItsDotIsFilledInPlace) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 4, 2);
  o.shards = 1;
  fs::create_directory(o.output);
  struct stat before, after;
  ASSERT_EQ(::stat(o.output.c_str(), &before), 0);
  const std::string folder = o.output;
  o.output = folder + "/.";
  auto report = MakeDataset(o);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->root, folder);
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"out", "out-shards", "photos"}));
  ASSERT_EQ(::stat(folder.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(ReadTree(folder).size(), 4u);
  EXPECT_TRUE(fs::exists(folder + "/" + kDatasetCompleteMarker));
  // Again, now over the complete data set there.
  ASSERT_TRUE(MakeDataset(o).ok());
  EXPECT_EQ(Names(tmp.path()), (std::vector<std::string>{"out", "out-shards", "photos"}));
}

// An older stoker made the built-in data set in `<root>.making-P.making-P`:
// gone with its process too.
TEST(DatasetMakerTest, TheDoubleSuffixedFoldersOfAnOlderStokerGoToo) {
  TempDir tmp;
  MakeDatasetOptions o = SmallDataset(tmp, "out", 2, 1);
  const pid_t child = GoneProcessId();
  ASSERT_GT(child, 0);
  const std::string pid = std::to_string(child);
  const std::string dead = o.output + ".making-" + pid + ".making-" + pid;
  const std::string other = o.output + ".making-" + pid + ".making-1";  // not that form
  for (const std::string& dir : {dead, other}) Write(fs::path(dir) / "x.jpg", {1});
  RemoveDeadMakings(o.output);
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(other));
}

TEST(DatasetMakerTest, PlansStayInRangeAndInsideThePhoto) {
  MakeDatasetOptions o;
  for (int64_t i = 0; i < 500; ++i) {
    ImagePlan p = PlanImage(o, i, 1280, 720);
    ASSERT_GE(p.width, 300);
    ASSERT_LE(p.width, 640);
    ASSERT_GE(p.quality, 75);
    ASSERT_LE(p.quality, 95);
    ASSERT_GE(p.crop_x, 0);
    ASSERT_GE(p.crop_y, 0);
    ASSERT_LE(p.crop_x + p.crop_width, 1280 + 1e-9);
    ASSERT_LE(p.crop_y + p.crop_height, 720 + 1e-9);
  }
}

TEST(DatasetMakerTest, AnImageHasItsPhotographsClassSoThatClassesCanBeLearned) {
  TempDir tmp;
  MakeDatasetOptions o;
  o.photos = MakePhotos(tmp.path());
  Write(fs::path(o.photos) / "Gamma/contents/images/800x600.jpg",
        testing::Jpeg(testing::MakePicture(800, 600, 3), 800, 600));
  o.images = 12;
  o.classes = 2;
  o.output = tmp.path() + "/out";
  auto report = MakeDataset(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  ASSERT_EQ(report->photos_used, 3);
  // Image i is cut from photograph i % 3, and its class is that one's, % 2:
  // photographs 0 and 2 in n000, photograph 1 in n001 (with i % 2 every
  // class would hold crops of every photograph).
  const auto files = ReadTree(o.output);
  ASSERT_EQ(files.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    const std::string name = "n00" + std::to_string(i % 3 % 2);
    char file[32];
    std::snprintf(file, sizeof file, "%s/%s_%06d.jpg", name.c_str(), name.c_str(), i);
    EXPECT_EQ(files.count(file), 1u) << file;
  }
}

TEST(DatasetMakerTest, BadOptionsAreNamed) {
  MakeDatasetOptions o;
  o.output = "/tmp/x";
  o.images = 5;
  o.classes = 6;
  Status s = ValidateMakeDatasetOptions(o);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("classes = 6"), std::string::npos) << s.message();
  o.classes = 2;
  o.max_quality = 101;
  EXPECT_NE(ValidateMakeDatasetOptions(o).message().find("max_quality"), std::string::npos);
  o.max_quality = 95;
  o.output.clear();
  EXPECT_FALSE(ValidateMakeDatasetOptions(o).ok());
}

// The real default photographs, when the package is installed.
TEST(DatasetMakerTest, CutsFromTheInstalledWallpapers) {
  if (!fs::exists("/usr/share/wallpapers")) GTEST_SKIP() << "no /usr/share/wallpapers";
  auto photos = FindPhotos("/usr/share/wallpapers");
  if (!photos.ok()) GTEST_SKIP() << photos.status().ToString();
  TempDir tmp;
  MakeDatasetOptions o;
  o.output = tmp.path() + "/w";
  o.images = 4;
  o.classes = 2;
  auto report = MakeDataset(o);
  ASSERT_TRUE(report.ok()) << report.status().ToString();
  EXPECT_EQ(ReadTree(o.output).size(), 4u);
}

}  // namespace
}  // namespace stoker
