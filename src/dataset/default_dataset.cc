#include <unistd.h>

#include <cstdlib>
#include <filesystem>
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

Result<std::string> EnsureDefaultDataset(bool quiet) {
  namespace fs = std::filesystem;
  const std::string path = DefaultDatasetPath();
  // Without the marker (an interrupted run, or an older layout) it is made
  // again rather than used.
  const std::string marker = path + "/" + kDatasetCompleteMarker;
  std::error_code ec;
  if (fs::exists(marker, ec)) return path;
  // Made beside it and renamed into place, so that loaders starting together
  // (local ranks) never see, nor remove, one another's half-made folder.
  const std::string making = path + ".making-" + std::to_string(::getpid());
  fs::remove_all(making, ec);
  RemoveDeadMakings(path);
  MakeDatasetOptions o;
  o.output = making;
  if (!quiet) {
    std::cerr << "stoker: making the built-in data set (" << o.images << " images, " << o.classes
              << " classes) in " << path << " ...\n";
  }
  Result<MakeDatasetReport> r = MakeDataset(o);  // its marker written last
  if (!r.ok()) {
    fs::remove_all(making, ec);
    return r.status();
  }
  // What is there now is an older layout or an interrupted run (stoker's own
  // cache: its files would stay beside the new ones), or another process's
  // finished one, which is kept.
  if (!fs::exists(marker, ec)) {
    const std::string old = path + ".old-" + std::to_string(::getpid());
    fs::rename(path, old, ec);  // fails harmlessly when there is none
    fs::remove_all(old, ec);
    fs::rename(making, path, ec);
  }
  fs::remove_all(making, ec);  // another process's came first
  if (!fs::exists(marker, ec)) {
    return IoError("cannot put the built-in data set in place at " + path +
                   (ec ? ": " + ec.message() : std::string()));
  }
  if (!quiet) {
    std::cerr << "stoker: wrote " << r->images << " images (" << (r->bytes >> 20) << " MiB) in "
              << r->seconds << " s\n";
  }
  return path;
}

}  // namespace stoker
