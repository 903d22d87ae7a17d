#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "stoker/status.h"

namespace stoker {

/// What MakeDataset writes: an ImageNet-like class-per-folder data set cut
/// from natural photographs, the default data of the demo and benchmarks.
struct MakeDatasetOptions {
  /// The folder to write, as OUT/<class>/<class>_<index>.jpg. It must be
  /// missing, empty, or a complete data set of an earlier run (which is
  /// replaced whole); the data set is made in OUT.making-<pid> beside it and
  /// renamed into place when complete, so OUT never mixes old files in.
  std::string output;
  /// Number of images, over `classes` classes named n000, n001, ... (wider
  /// numbers past 1000 classes). Image i is cut from photograph i % P and
  /// belongs to class (i % P) % classes, so that a class's images share their
  /// scenes and can be learned; with fewer photographs than classes, i % classes.
  int64_t images = 2000;
  int classes = 10;
  /// Same seed and photographs, byte-identical files.
  uint64_t seed = 0;
  /// With K > 0, also writes the same images as K WebDataset-style tar
  /// shards OUT-shards/shard-000.tar ... (members <key>.jpg and <key>.cls,
  /// the label as decimal text), put in place as OUT is. With 0, an
  /// OUT-shards folder already there is left alone.
  int shards = 0;
  /// Where the photographs come from: every <name>/contents/images*/ folder
  /// under it (the layout of Debian's plasma-workspace-wallpapers) gives its
  /// largest .jpg or .png.
  std::string photos = "/usr/share/wallpapers";
  /// Image width range, aspect (height / width) range and JPEG quality range;
  /// each image draws its own. The defaults give about 0.18 MP on average.
  int min_width = 300;
  int max_width = 640;
  double min_aspect = 0.6;
  double max_aspect = 1.0;
  int min_quality = 75;
  int max_quality = 95;
  /// Asked between images and shards: true ends the run (kCancelled
  /// "interrupted"), leaving nothing of it behind. Empty: never.
  std::function<bool()> stop;
};

/// What MakeDataset wrote.
struct MakeDatasetReport {
  std::string root;
  std::vector<std::string> class_names;
  int64_t images = 0;
  int64_t bytes = 0;       // JPEG bytes written to the folder tree
  double mean_pixels = 0;  // mean width * height
  int photos_used = 0;     // source photographs decoded
  std::vector<std::string> shard_paths;
  double seconds = 0;
};

/// Writes the data set described by `options`. Each photograph is decoded
/// once (at a reduced DCT scale when large) and many images are cut from it:
/// a random crop of the image's aspect, resized with an antialiased filter,
/// sometimes mirrored, about 1 % grayscale, encoded with libjpeg-turbo at a
/// random quality. Everything drawn for image i comes from a counter-based
/// generator keyed by (seed, i), so output does not depend on order.
///
/// Blocks; single-threaded. Errors: InvalidArgument naming a bad option,
/// FailedPrecondition naming an output folder that holds other files (checked
/// before any work), NotFound when `photos` holds no photograph, DataError
/// naming a photograph that cannot be decoded, IoError naming a file that
/// cannot be written. On error nothing is left beside the output, and what
/// was at the output is unchanged.
Result<MakeDatasetReport> MakeDataset(const MakeDatasetOptions& options);

/// Where the built-in data set lives: $STOKER_DATA_HOME/imagenet-like, else
/// $XDG_CACHE_HOME/stoker/imagenet-like, else ~/.cache/stoker/imagenet-like.
std::string DefaultDatasetPath();

/// Makes the built-in data set (MakeDatasetOptions' defaults) at
/// DefaultDatasetPath() unless a complete one is there, and returns its path.
/// Progress goes to stderr unless `quiet`. Blocks (tens of seconds the first
/// time). The CLI and the Python module share it, so either makes it once.
/// `stop` (empty: never) is MakeDatasetOptions::stop: true ends the making
/// (kCancelled "interrupted"), leaving nothing of it behind.
Result<std::string> EnsureDefaultDataset(bool quiet, std::function<bool()> stop = {});

}  // namespace stoker
