#include <sys/stat.h>

#include <cerrno>

#include "stoker/image_sources.h"

namespace stoker {
namespace {

// A tar, a compressed one too (".tar.gz", ".tgz": refused naming its
// compressor, not read as a list file), or a pattern.
bool NamesTarShards(const std::string& path) {
  static constexpr std::string_view kSuffixes[] = {
      ".tar",     ".tar.gz", ".tar.bz2", ".tar.xz", ".tar.zst", ".tar.lz4", ".tar.lzma",
      ".tar.zip", ".tgz",    ".tbz",     ".tbz2",   ".txz",     ".tzst"};
  for (std::string_view suffix : kSuffixes) {
    if (path.ends_with(suffix)) return true;
  }
  return path.find('{') != std::string::npos;
}

bool Exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 || errno != ENOENT;  // unreadable is not missing
}

}  // namespace

std::string MissingDataPlace(const std::string& data_path) {
  if (data_path.find('{') == std::string::npos) return Exists(data_path) ? "" : data_path;
  Result<std::vector<std::string>> names = ExpandBraces(data_path);
  if (!names.ok()) return "";
  for (const std::string& name : *names) {
    if (Exists(name)) return "";
  }
  return data_path;
}

Result<std::shared_ptr<const Source>> OpenDataPath(const std::string& path, DataPathKind* kind) {
  struct stat st {};
  const int err = ::stat(path.c_str(), &st) == 0 ? 0 : errno;
  DataPathKind found;
  // A folder first: a folder whose name ends in ".tar" is still a folder.
  if (err == 0 && S_ISDIR(st.st_mode)) {
    found = DataPathKind::kImageFolder;
  } else if (NamesTarShards(path)) {
    // A pattern names no file itself, so whether it exists is OpenTarShards's to say.
    found = DataPathKind::kTarShards;
  } else if (err == 0 && S_ISREG(st.st_mode)) {
    found = DataPathKind::kFileList;
  } else if (err == ENOENT || err == ENOTDIR) {
    return NotFound("no such folder, tar shard or list file: " + path);
  } else if (err != 0) {
    return ErrnoError(path, err);
  } else {
    return InvalidArgument(path + " is not a folder, a tar shard or a list file");
  }
  if (kind != nullptr) *kind = found;
  switch (found) {
    case DataPathKind::kImageFolder:
      return OpenImageFolder(path);
    case DataPathKind::kTarShards:
      return OpenTarShards({path});
    case DataPathKind::kFileList:
      break;
  }
  return OpenFileList(path);
}

}  // namespace stoker
