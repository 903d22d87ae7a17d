#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "stoker/dataset.h"

namespace stoker {
namespace {

// Written last, so that an interrupted run is made again rather than used.
constexpr const char* kCompleteMarker = ".stoker-complete";

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
