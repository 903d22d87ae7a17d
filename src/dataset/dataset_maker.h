#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "stoker/dataset.h"

namespace stoker {

/// The file MakeDataset writes last into each folder it makes (the images'
/// and the shards'). A folder holding it is a complete data set, which a
/// later MakeDataset may replace; v2: classes follow photographs.
inline constexpr char kDatasetCompleteMarker[] = ".stoker-complete-v2";

/// The photographs MakeDataset cuts from: the largest .jpg/.jpeg/.png of
/// every <root>/<name>/contents/images*/ folder, in sorted order.
/// Errors: NotFound when there is none.
Result<std::vector<std::string>> FindPhotos(const std::string& root);

/// Everything drawn for one image of the data set: a pure function of
/// (options.seed, index) and the photograph's working size.
struct ImagePlan {
  int width = 0;
  int height = 0;
  int quality = 0;
  bool grayscale = false;
  bool mirrored = false;
  /// The crop of the photograph (working size), in pixels; may be fractional.
  double crop_x = 0;
  double crop_y = 0;
  double crop_width = 0;
  double crop_height = 0;
};
ImagePlan PlanImage(const MakeDatasetOptions& options, int64_t index, int photo_width,
                    int photo_height);

/// Removes the folders `<root>.making-<pid>` (and their "-shards") beside
/// `root` whose process is gone: a run killed outside stoker's hands
/// (SIGKILL, a crash, Ctrl-C before a handler) left them, 8 MB and more each.
/// An older stoker's `<root>.making-<pid>.making-<pid>` (the built-in data
/// set's) go too.
void RemoveDeadMakings(const std::string& root);

/// What MakeDatasetAt does with what it finds at the output folder.
enum class Placement {
  /// MakeDataset's: replaces an empty folder or a complete data set, and
  /// refuses anything else before any work.
  kReplaceComplete,
  /// The built-in data set's (stoker's own cache): keeps a complete data set
  /// found there when done (another process's, made meanwhile) and drops the
  /// one made; replaces anything else (an older layout, an interrupted run).
  kKeepComplete,
};

/// MakeDataset with the output folder handled as `placement` says. Made in
/// `<output>.making-<pid>` either way, removed on error or stop.
Result<MakeDatasetReport> MakeDatasetAt(const MakeDatasetOptions& options, Placement placement);

/// Checks `options`; the error names the option and its value.
Status ValidateMakeDatasetOptions(const MakeDatasetOptions& options);

}  // namespace stoker
