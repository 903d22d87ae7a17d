#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>

#include "dataset/dataset_maker.h"
#include "stoker/dataset.h"

namespace stoker {

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

Result<std::string> EnsureDefaultDataset(bool quiet, std::function<bool()> stop) {
  const std::string path = DefaultDatasetPath();
  // Without the marker (an interrupted run, or an older layout) it is made
  // again rather than used.
  std::error_code ec;
  if (std::filesystem::exists(path + "/" + kDatasetCompleteMarker, ec)) return path;
  MakeDatasetOptions o;
  o.output = path;
  o.stop = std::move(stop);
  if (!quiet) {
    std::cerr << "stoker: making the built-in data set (" << o.images << " images, " << o.classes
              << " classes) in " << path << " ...\n";
  }
  // Made beside it and renamed into place, so that loaders starting together
  // (local ranks) never see, nor remove, one another's half-made folder; the
  // first one complete stays.
  Result<MakeDatasetReport> r = MakeDatasetAt(o, Placement::kKeepComplete);
  if (!r.ok()) return r.status();
  if (!quiet) {
    std::cerr << "stoker: wrote " << r->images << " images (" << (r->bytes >> 20) << " MiB) in "
              << r->seconds << " s\n";
  }
  return path;
}

}  // namespace stoker
