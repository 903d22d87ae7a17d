#include "dataset/dataset_maker.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "core/number_text.h"
#include "source/tar_shard.h"
#include "stoker/rng.h"
#include "transform/image_format.h"
#include "transform/jpeg_decoder.h"
#include "transform/jpeg_encoder.h"
#include "transform/png_decoder.h"
#include "transform/resize.h"

namespace stoker {
namespace {

namespace fs = std::filesystem;

// The epoch word of the generator's key: keeps the data set's draws apart
// from any training stream with the same seed.
constexpr uint64_t kDatasetStream = 0x4D414B45'44415441ull;  // "MAKEDATA"

// Photographs are brought down to about this shorter side once (DCT scaling
// for JPEG, the resampler for PNG), then cut: big enough for 640-px images,
// small enough that each cut is cheap.
constexpr int kWorkingShorterSide = 720;
constexpr int64_t kMaxPhotoPixels = 89'478'485;

Status BadOption(const std::string& name, double value, const std::string& expected) {
  return InvalidArgument("make-dataset: " + name + " = " + FormatNumber(value) + ", expected " +
                         expected);
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<fs::path> SortedEntries(const fs::path& dir) {
  std::vector<fs::path> out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    out.push_back(it->path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

Status ReadFile(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) return ErrnoError("cannot open " + path, errno);
  const std::streamsize size = in.tellg();
  in.seekg(0);
  out->resize(static_cast<size_t>(size));
  if (!in.read(reinterpret_cast<char*>(out->data()), size)) {
    return IoError("cannot read " + path);
  }
  return Status::Ok();
}

Status WriteFile(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return ErrnoError("cannot create " + path, errno);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) return ErrnoError("cannot write " + path, ok ? errno : err);
  return Status::Ok();
}

std::string Padded(int64_t value, int width) {
  std::string s = std::to_string(value);
  if (static_cast<int>(s.size()) < width) s.insert(0, static_cast<size_t>(width) - s.size(), '0');
  return s;
}

int DigitsFor(int64_t count) {
  int digits = 1;
  for (int64_t v = count - 1; v >= 10; v /= 10) ++digits;
  return digits;
}

// A photograph brought to its working size, 8-bit RGB.
struct Photo {
  DecodedRegion view;
  std::vector<uint8_t> decoded;
  std::vector<uint8_t> reduced;
};

class PhotoLoader {
 public:
  Status Load(const std::string& path, Photo* photo) {
    STOKER_RETURN_IF_ERROR(ReadFile(path, &file_));
    std::span<const std::byte> bytes = std::as_bytes(std::span<const uint8_t>(file_));
    int width, height;
    const bool jpeg = LooksLikeJpeg(bytes);
    if (jpeg) {
      STOKER_RETURN_IF_ERROR(jpeg_.ReadHeader(bytes).WithContext(path));
      width = jpeg_.width();
      height = jpeg_.height();
    } else if (LooksLikePng(bytes)) {
      STOKER_RETURN_IF_ERROR(png_.ReadHeader(bytes).WithContext(path));
      width = png_.width();
      height = png_.height();
    } else {
      return DataError(path + ": " + NotJpegOrPng(bytes));
    }
    if (static_cast<int64_t>(width) * height > kMaxPhotoPixels) {
      return ResourceExhausted(path + ": " + std::to_string(width) + "x" + std::to_string(height) +
                               " is over the pixel cap");
    }
    int factor = 1;
    for (int f : {8, 4, 2}) {
      if (std::min(width, height) / f >= kWorkingShorterSide) {
        factor = f;
        break;
      }
    }
    if (jpeg) {
      const int w = JpegDecoder::ScaledSize(width, factor),
                h = JpegDecoder::ScaledSize(height, factor);
      return jpeg_.DecodeRegion(factor, 0, 0, w, h, &photo->decoded, &photo->view)
          .WithContext(path);
    }
    STOKER_RETURN_IF_ERROR(
        png_.DecodeRegion(0, 0, width, height, &photo->decoded, &photo->view).WithContext(path));
    if (factor > 1) {
      // PNG has no DCT scaling: one antialiased resample to the working size.
      const int w = width / factor, h = height / factor;
      ResampleTaps tx, ty;
      ComputeTaps(0, static_cast<double>(width) / w, w, 0, width, &tx);
      ComputeTaps(0, static_cast<double>(height) / h, h, 0, height, &ty);
      photo->reduced.resize(static_cast<size_t>(w) * h * 3);
      uint8_t* out = photo->reduced.data();
      ResampleRgb(photo->view, tx, ty, false, buffers_, [&](int y, const float* px) {
        uint8_t* p = out + static_cast<size_t>(y) * w * 3;
        for (int x = 0; x < w; ++x) {
          for (int c = 0; c < 3; ++c) p[3 * x + c] = ToByte(px[4 * x + c]);
        }
      });
      photo->view = {out, 0, 0, w, h, static_cast<size_t>(w) * 3};
    }
    return Status::Ok();
  }

  static uint8_t ToByte(float v) {
    return static_cast<uint8_t>(std::clamp(std::lround(v), 0L, 255L));
  }

 private:
  std::vector<uint8_t> file_;
  JpegDecoder jpeg_;
  PngDecoder png_;
  ResampleBuffers buffers_;
};

// Cuts, resizes and encodes one image of `plan` from `photo` into `jpeg`.
class ImageCutter {
 public:
  Status Cut(const DecodedRegion& photo, const ImagePlan& plan, std::vector<uint8_t>* jpeg) {
    const int w = plan.width, h = plan.height;
    ComputeTaps(plan.crop_x, plan.crop_width / w, w, static_cast<int>(std::floor(plan.crop_x)),
                std::min(photo.width, static_cast<int>(std::ceil(plan.crop_x + plan.crop_width))),
                &tx_);
    ComputeTaps(plan.crop_y, plan.crop_height / h, h, static_cast<int>(std::floor(plan.crop_y)),
                std::min(photo.height, static_cast<int>(std::ceil(plan.crop_y + plan.crop_height))),
                &ty_);
    const int channels = plan.grayscale ? 1 : 3;
    pixels_.resize(static_cast<size_t>(w) * h * channels);
    uint8_t* out = pixels_.data();
    ResampleRgb(photo, tx_, ty_, plan.mirrored, buffers_, [&](int y, const float* px) {
      uint8_t* row = out + static_cast<size_t>(y) * w * channels;
      for (int x = 0; x < w; ++x) {
        const float* p = px + 4 * x;
        if (channels == 1) {
          row[x] = PhotoLoader::ToByte(0.299f * p[0] + 0.587f * p[1] + 0.114f * p[2]);
        } else {
          for (int c = 0; c < 3; ++c) row[3 * x + c] = PhotoLoader::ToByte(p[c]);
        }
      }
    });
    JpegEncodeOptions eo;
    eo.quality = plan.quality;
    return EncodeJpeg(out, w, h, channels, eo, jpeg);
  }

 private:
  ResampleTaps tx_, ty_;
  ResampleBuffers buffers_;
  std::vector<uint8_t> pixels_;
};

std::string StripTrailingSlashes(std::string s) {
  while (s.size() > 1 && s.back() == '/') s.pop_back();
  return s;
}

// The folder to write: `output` without trailing slashes, a last "." or
// ".." as the folder's own path (the data set is made beside its target,
// never inside it), or, when it is a symbolic link, the folder it points to
// (a link is replaced by rename, not the folder behind it).
Result<std::string> ResolveOutput(const std::string& output) {
  std::string root = StripTrailingSlashes(output);
  std::error_code ec;
  if (const std::string last = fs::path(root).filename().string(); last == "." || last == "..") {
    const fs::path absolute = fs::absolute(root, ec);
    if (ec) return IoError("make-dataset: " + root + ": " + ec.message());
    root = StripTrailingSlashes(absolute.lexically_normal().string());
  }
  if (!fs::is_symlink(root, ec)) return root;
  const fs::path target = fs::canonical(root, ec);
  if (ec) return IoError("make-dataset: " + root + " is a symbolic link: " + ec.message());
  return target.string();
}

// A folder on another file system than the one it is in (a volume, a fresh
// disk) cannot be renamed into: refused before the work, naming a way out.
Status CheckNotMountPoint(const std::string& dir) {
  struct stat own, parent;
  const std::string above = fs::path(dir).parent_path().string();
  if (::stat(dir.c_str(), &own) != 0 || ::stat(above.empty() ? "." : above.c_str(), &parent) != 0 ||
      own.st_dev == parent.st_dev) {
    return Status::Ok();
  }
  return FailedPrecondition("make-dataset: " + dir +
                            " is a mount point: a data set is made beside its folder and moved "
                            "into place, which cannot cross file systems; name a folder inside "
                            "it (" +
                            dir + "/data)");
}

// Written last into each folder a run makes: with it the folder is a
// complete data set, which a later run may replace whole.
Status WriteCompleteMarker(const MakeDatasetOptions& o, const std::string& dir) {
  const std::string text = "stoker make-dataset\nimages " + std::to_string(o.images) +
                           "\nclasses " + std::to_string(o.classes) + "\nseed " +
                           std::to_string(o.seed) + "\nshards " + std::to_string(o.shards) + "\n";
  return WriteFile(dir + "/" + kDatasetCompleteMarker,
                   std::vector<uint8_t>(text.begin(), text.end()));
}

// Whether a new data set may take the place of `dir`: it is absent, an empty
// folder, or a complete data set of an earlier run. Anything else (an
// interrupted run of an older stoker, the user's files) is not ours to remove.
Status CheckReplaceable(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (!fs::exists(st)) return Status::Ok();
  if (fs::is_symlink(st)) {
    return FailedPrecondition("make-dataset: " + dir +
                              " is a symbolic link; name the folder it points to");
  }
  if (!fs::is_directory(st)) {
    return FailedPrecondition("make-dataset: " + dir + " exists and is not a folder");
  }
  if (fs::is_empty(dir, ec) || fs::exists(dir + "/" + kDatasetCompleteMarker, ec)) {
    return Status::Ok();
  }
  return FailedPrecondition("make-dataset: " + dir +
                            " is not empty and is not a complete data set of stoker's (no " +
                            kDatasetCompleteMarker +
                            "): an interrupted run or other files; remove it or choose another "
                            "folder");
}

// A folder MoveIntoPlace moved in: Finish() drops the earlier data set it
// moved aside, Undo() puts that back and `made` where it was.
struct Placed {
  std::string made, target;
  std::string old;      // the earlier data set, moved aside ("" if none)
  bool filled = false;  // `made`'s entries went into the target, an empty folder that stays
  bool moved = false;

  void Finish() {
    std::error_code ec;
    if (!old.empty()) fs::remove_all(old, ec);
  }
  void Undo() {
    std::error_code ec;
    if (moved && filled) {
      for (const fs::path& entry : SortedEntries(target)) fs::remove_all(entry, ec);
    } else if (moved) {
      fs::rename(target, made, ec);
    }
    if (!old.empty()) fs::rename(old, target, ec);
  }
};

// Moves the complete folder `made` to `target`, replacing what `placement`
// allows there; under kKeepComplete a complete data set there stays and
// `made` is left for the caller to remove. An empty folder there stays and
// gets `made`'s entries, its marker last (it may be the caller's working
// folder, which a rename would leave deleted under it).
Status MoveIntoPlace(const std::string& made, const std::string& target, Placement placement,
                     Placed* placed) {
  *placed = Placed{made, target};
  std::error_code ec;
  if (placement == Placement::kKeepComplete) {
    if (fs::exists(target + "/" + kDatasetCompleteMarker, ec)) return Status::Ok();
  } else {
    STOKER_RETURN_IF_ERROR(CheckReplaceable(target));
  }
  const bool exists = fs::exists(fs::symlink_status(target, ec));
  if (exists && fs::is_directory(fs::symlink_status(target, ec)) && fs::is_empty(target, ec)) {
    std::vector<fs::path> entries = SortedEntries(made);
    std::stable_partition(entries.begin(), entries.end(),
                          [](const fs::path& e) { return e.filename() != kDatasetCompleteMarker; });
    placed->moved = placed->filled = true;
    for (const fs::path& entry : entries) {
      fs::rename(entry, fs::path(target) / entry.filename(), ec);
      if (ec) {
        const Status error = IoError("make-dataset: cannot move " + entry.string() + " into " +
                                     target + ": " + ec.message());
        placed->Undo();
        *placed = Placed{made, target};
        return error;
      }
    }
    fs::remove(made, ec);
    return Status::Ok();
  }
  if (exists && !fs::is_empty(target, ec)) {
    placed->old = target + ".old-" + std::to_string(::getpid());
    fs::remove_all(placed->old, ec);
    fs::rename(target, placed->old, ec);
    if (ec) {
      placed->old.clear();
      return IoError("make-dataset: cannot move " + target + " aside: " + ec.message());
    }
  }
  fs::rename(made, target, ec);  // rename(2) replaces an empty folder
  if (ec) {
    const Status error =
        IoError("make-dataset: cannot move " + made + " to " + target + ": " + ec.message());
    placed->Undo();  // the earlier data set back
    placed->old.clear();
    return error;
  }
  placed->moved = true;
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::string>> FindPhotos(const std::string& root) {
  std::vector<std::string> photos;
  for (const fs::path& theme : SortedEntries(root)) {
    for (const fs::path& folder : SortedEntries(theme / "contents")) {
      if (folder.filename().string().rfind("images", 0) != 0) continue;
      std::string best;
      uintmax_t best_size = 0;
      for (const fs::path& file : SortedEntries(folder)) {
        const std::string ext = Lower(file.extension().string());
        if (ext != ".jpg" && ext != ".jpeg" && ext != ".png") continue;
        std::error_code ec;
        if (!fs::is_regular_file(file, ec)) continue;
        const uintmax_t size = fs::file_size(file, ec);
        if (!ec && size > best_size) {
          best_size = size;
          best = file.string();
        }
      }
      if (!best.empty()) photos.push_back(best);
    }
  }
  if (photos.empty()) {
    return NotFound("make-dataset: no photographs (*/contents/images*/*.jpg or *.png) under " +
                    root);
  }
  return photos;
}

ImagePlan PlanImage(const MakeDatasetOptions& o, int64_t index, int photo_width, int photo_height) {
  SampleRng rng(o.seed, kDatasetStream, static_cast<uint64_t>(index));
  ImagePlan p;
  p.width = o.min_width +
            static_cast<int>(rng.Below(static_cast<uint64_t>(o.max_width - o.min_width + 1)));
  const double aspect = rng.Uniform(o.min_aspect, o.max_aspect);
  p.height = std::max(1, static_cast<int>(std::lround(p.width * aspect)));
  p.quality = o.min_quality +
              static_cast<int>(rng.Below(static_cast<uint64_t>(o.max_quality - o.min_quality + 1)));
  p.grayscale = rng.Below(100) == 0;
  p.mirrored = rng.Below(2) == 1;
  const double zoom = rng.Uniform(0.4, 1.0);
  const double fx = rng.Uniform();
  const double fy = rng.Uniform();
  // The largest crop of the image's aspect that fits, scaled by `zoom`, but
  // not below the image's own size when the photograph allows (no upscaling).
  const double a = static_cast<double>(p.height) / p.width;
  const double max_w = std::min<double>(photo_width, photo_height / a);
  p.crop_width = std::max(std::min<double>(max_w, p.width), max_w * zoom);
  p.crop_height = p.crop_width * a;
  p.crop_x = fx * (photo_width - p.crop_width);
  p.crop_y = fy * std::max(0.0, photo_height - p.crop_height);
  return p;
}

Status ValidateMakeDatasetOptions(const MakeDatasetOptions& o) {
  if (o.output.empty()) return InvalidArgument("make-dataset: the output folder is empty");
  if (o.images < 1) return BadOption("images", static_cast<double>(o.images), ">= 1");
  if (o.classes < 1 || o.classes > o.images) {
    return BadOption("classes", o.classes, "1..images (" + std::to_string(o.images) + ")");
  }
  if (o.shards < 0 || o.shards > o.images) {
    return BadOption("shards", o.shards, "0..images (" + std::to_string(o.images) + ")");
  }
  if (o.min_width < 8 || o.min_width > 8192) return BadOption("min_width", o.min_width, "8..8192");
  if (o.max_width < o.min_width || o.max_width > 8192) {
    return BadOption("max_width", o.max_width, "min_width..8192");
  }
  if (!(o.min_aspect > 0.05 && o.min_aspect <= 20)) {
    return BadOption("min_aspect", o.min_aspect, "in (0.05, 20]");
  }
  if (!(o.max_aspect >= o.min_aspect && o.max_aspect <= 20)) {
    return BadOption("max_aspect", o.max_aspect, "in [min_aspect, 20]");
  }
  if (o.min_quality < 1 || o.min_quality > 100) {
    return BadOption("min_quality", o.min_quality, "1..100");
  }
  if (o.max_quality < o.min_quality || o.max_quality > 100) {
    return BadOption("max_quality", o.max_quality, "min_quality..100");
  }
  return Status::Ok();
}

namespace {

// Writes the data set of `o` into the folder `dir` (and its shards into
// dir + "-shards"), filling `report` but for `root` and `seconds`; shard
// paths are under `dir`.
Status WriteDataset(const MakeDatasetOptions& o, const std::vector<std::string>& photos,
                    const std::string& dir, MakeDatasetReport& report) {
  const int class_digits = std::max(3, DigitsFor(o.classes));
  const int index_digits = std::max(6, DigitsFor(o.images));
  for (int c = 0; c < o.classes; ++c) {
    // (Built by appending: GCC 12 warns falsely on "n" + std::string.)
    std::string name(1, 'n');
    name += Padded(c, class_digits);
    report.class_names.push_back(name);
    const std::string class_dir = dir + "/" + report.class_names.back();
    std::error_code ec;
    fs::create_directories(class_dir, ec);
    if (ec) return IoError("make-dataset: cannot create " + class_dir + ": " + ec.message());
  }
  // Image i comes from photograph i % P: each photograph is decoded once and
  // every image it gives is cut while it is in memory.
  const int64_t photo_count = std::min<int64_t>(static_cast<int64_t>(photos.size()), o.images);
  // Its class is its photograph's, (i % P) % classes, when there are
  // photographs for every class: a class's images are crops of the same
  // scenes, which a model can learn.
  auto class_of = [&](int64_t i) {
    return static_cast<size_t>(photo_count >= o.classes ? i % photo_count % o.classes
                                                        : i % o.classes);
  };
  auto key_of = [&](int64_t i) {
    return report.class_names[class_of(i)] + "_" + Padded(i, index_digits);
  };
  auto path_of = [&](int64_t i) {
    return dir + "/" + report.class_names[class_of(i)] + "/" + key_of(i) + ".jpg";
  };

  PhotoLoader loader;
  ImageCutter cutter;
  Photo photo;
  std::vector<uint8_t> jpeg;
  double pixels = 0;
  for (int64_t p = 0; p < photo_count; ++p) {
    STOKER_RETURN_IF_ERROR(loader.Load(photos[static_cast<size_t>(p)], &photo));
    ++report.photos_used;
    for (int64_t i = p; i < o.images; i += photo_count) {
      if (o.stop && o.stop()) return Cancelled("interrupted");
      ImagePlan plan = PlanImage(o, i, photo.view.width, photo.view.height);
      STOKER_RETURN_IF_ERROR(cutter.Cut(photo.view, plan, &jpeg));
      STOKER_RETURN_IF_ERROR(WriteFile(path_of(i), jpeg));
      ++report.images;
      report.bytes += static_cast<int64_t>(jpeg.size());
      pixels += static_cast<double>(plan.width) * plan.height;
    }
  }
  report.mean_pixels = pixels / static_cast<double>(report.images);
  STOKER_RETURN_IF_ERROR(WriteCompleteMarker(o, dir));
  if (o.shards == 0) return Status::Ok();

  const std::string shard_dir = dir + "-shards";
  std::error_code ec;
  fs::create_directories(shard_dir, ec);
  if (ec) return IoError("make-dataset: cannot create " + shard_dir + ": " + ec.message());
  const int shard_digits = std::max(3, DigitsFor(o.shards));
  std::vector<std::vector<uint8_t>> files;
  std::vector<std::string> labels;
  std::vector<TarMember> members;
  for (int k = 0; k < o.shards; ++k) {
    if (o.stop && o.stop()) return Cancelled("interrupted");
    const int64_t begin = o.images * k / o.shards, end = o.images * (k + 1) / o.shards;
    files.resize(static_cast<size_t>(end - begin));
    labels.resize(static_cast<size_t>(end - begin));
    members.clear();
    for (int64_t i = begin; i < end; ++i) {
      const size_t j = static_cast<size_t>(i - begin);
      STOKER_RETURN_IF_ERROR(ReadFile(path_of(i), &files[j]));
      labels[j] = std::to_string(class_of(i));
      members.push_back({key_of(i) + ".jpg", std::as_bytes(std::span<const uint8_t>(files[j]))});
      members.push_back({key_of(i) + ".cls", std::as_bytes(std::span<const char>(labels[j]))});
    }
    const std::string path = shard_dir + "/shard-" + Padded(k, shard_digits) + ".tar";
    STOKER_RETURN_IF_ERROR(WriteTarShard(path, members));
    report.shard_paths.push_back(path);
  }
  return WriteCompleteMarker(o, shard_dir);
}

}  // namespace

void RemoveDeadMakings(const std::string& root) {
  const fs::path target(root);
  const std::string prefix = target.filename().string() + ".making-";
  std::error_code ec;
  for (fs::directory_iterator it(target.parent_path().empty() ? "." : target.parent_path(), ec),
       end;
       !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    std::string digits = name.substr(prefix.size());
    if (digits.ends_with("-shards")) digits.resize(digits.size() - 7);
    // An older stoker made the built-in data set in `<root>.making-P.making-P`.
    if (const size_t inner = digits.find(".making-");
        inner != std::string::npos && digits.substr(inner + 8) == digits.substr(0, inner)) {
      digits.resize(inner);
    }
    const std::optional<pid_t> pid = ParseInteger<pid_t>(digits);
    if (!pid || *pid <= 0 || std::to_string(*pid) != digits) continue;
    // Gone (ESRCH); a live process, or one of another user's (EPERM), keeps its own.
    if (::kill(static_cast<pid_t>(*pid), 0) != 0 && errno == ESRCH) {
      std::error_code removed;
      fs::remove_all(it->path(), removed);
    }
  }
}

Result<MakeDatasetReport> MakeDataset(const MakeDatasetOptions& o) {
  return MakeDatasetAt(o, Placement::kReplaceComplete);
}

Result<MakeDatasetReport> MakeDatasetAt(const MakeDatasetOptions& o, Placement placement) {
  const auto start = std::chrono::steady_clock::now();
  STOKER_RETURN_IF_ERROR(ValidateMakeDatasetOptions(o));
  STOKER_ASSIGN_OR_RETURN(const std::string root, ResolveOutput(o.output));
  const std::string shard_root = root + "-shards";
  // Refused before the minutes of work, and checked again when moving in.
  if (placement == Placement::kReplaceComplete) {
    STOKER_RETURN_IF_ERROR(CheckReplaceable(root));
    if (o.shards > 0) STOKER_RETURN_IF_ERROR(CheckReplaceable(shard_root));
  }
  STOKER_RETURN_IF_ERROR(CheckNotMountPoint(root));
  if (o.shards > 0) STOKER_RETURN_IF_ERROR(CheckNotMountPoint(shard_root));
  STOKER_ASSIGN_OR_RETURN(std::vector<std::string> photos, FindPhotos(o.photos));

  // Made in a fresh folder beside the target and moved into place complete:
  // an interrupted run leaves only that folder, never a half-made target,
  // and nothing of an earlier run mixes in.
  const std::string making = root + ".making-" + std::to_string(::getpid());
  auto remove_making = [&] {
    std::error_code ec;
    fs::remove_all(making, ec);
    fs::remove_all(making + "-shards", ec);
  };
  remove_making();  // a dead process's of the same id
  RemoveDeadMakings(root);
  // The folders above the output that this run makes, deepest first: a
  // failed or stopped run removes them again (those still empty).
  std::vector<fs::path> made_parents;
  std::error_code parent_ec;
  for (fs::path p = fs::path(root).parent_path(); !p.empty() && !fs::exists(p, parent_ec);
       p = p.parent_path()) {
    made_parents.push_back(p);
  }
  MakeDatasetReport report;
  Status status = WriteDataset(o, photos, making, report);
  // Each folder moves in whole, its marker in it; the shards go back out
  // when the images cannot follow (a data set's two folders match).
  Placed shards, images;
  if (status.ok() && o.shards > 0) {
    status = MoveIntoPlace(making + "-shards", shard_root, placement, &shards);
  }
  if (status.ok()) status = MoveIntoPlace(making, root, placement, &images);
  if (status.ok()) {
    shards.Finish();
    images.Finish();
  } else {
    shards.Undo();
  }
  remove_making();
  if (!status.ok()) {
    for (const fs::path& p : made_parents) fs::remove(p, parent_ec);  // fails when not empty
    return status;
  }
  // Without shards, an earlier run's shards of stoker's would outlive the
  // data set they were made from.
  if (o.shards == 0 && fs::exists(fs::symlink_status(shard_root)) &&
      CheckReplaceable(shard_root).ok()) {
    std::error_code ec;
    fs::remove_all(shard_root, ec);
    if (ec)
      return IoError("make-dataset: cannot remove the earlier " + shard_root + ": " + ec.message());
  }
  report.root = root;
  for (std::string& path : report.shard_paths) path.replace(0, making.size(), root);
  report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return report;
}

}  // namespace stoker
