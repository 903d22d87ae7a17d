#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "stoker/dataset.h"

namespace stoker {
namespace {

// Written last, so that an interrupted run is made again rather than used.
// v2: classes follow photographs; a folder of another layout is made again.
constexpr const char* kCompleteMarker = ".stoker-complete-v2";

}  // namespace

std::string DefaultDatasetPath() {
  if (const char* d = std::getenv("STOKER_DATA_HOME"); d && *d) {
    return std::string(d) + "/imagenet-like";
  }
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) {
    base = x;
  } else if (const char* h = std::getenv("HOME"); h && *h) {
    base = std::string(h) + "/.cache";
  } else {
    base = "/tmp";
  }
  return base + "/stoker/imagenet-like";
}

Result<std::string> EnsureDefaultDataset(bool quiet) {
  const std::string path = DefaultDatasetPath();
  std::error_code ec;
  if (std::filesystem::exists(path + "/" + kCompleteMarker, ec)) return path;
  // What is there is an interrupted run or an older layout, whose files would
  // stay beside the new ones: the folder is stoker's own cache.
  std::filesystem::remove_all(path, ec);
  if (ec)
    return IoError("cannot remove the incomplete built-in data set " + path + ": " + ec.message());
  MakeDatasetOptions o;
  o.output = path;
  if (!quiet) {
    std::cerr << "stoker: making the built-in data set (" << o.images << " images, " << o.classes
              << " classes) in " << path << " ...\n";
  }
  STOKER_ASSIGN_OR_RETURN(MakeDatasetReport r, MakeDataset(o));
  std::ofstream marker(path + "/" + kCompleteMarker);
  marker << r.images << "\n";
  if (!marker) return IoError("cannot write " + path + "/" + kCompleteMarker);
  if (!quiet) {
    std::cerr << "stoker: wrote " << r.images << " images (" << (r.bytes >> 20) << " MiB) in "
              << r.seconds << " s\n";
  }
  return path;
}

}  // namespace stoker
