#include "source/image_folder.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "core/unique_fd.h"
#include "source/file_list.h"

namespace stoker {
namespace {

constexpr std::string_view kImageExtensions[] = {".jpg", ".jpeg", ".png",  ".ppm", ".bmp",
                                                 ".pgm", ".tif",  ".tiff", ".webp"};

// Decodes the code point starting at s[i] as Python's UTF-8 decoder with
// surrogateescape would, and advances i past it.
char32_t NextCodePoint(std::string_view s, size_t& i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char b0 = byte(i);
  auto cont = [&](size_t k, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
    return k < s.size() && byte(k) >= lo && byte(k) <= hi;
  };
  if (b0 < 0x80) {
    i += 1;
    return b0;
  }
  if (b0 >= 0xC2 && b0 <= 0xDF && cont(i + 1)) {
    char32_t c = ((b0 & 0x1Fu) << 6) | (byte(i + 1) & 0x3Fu);
    i += 2;
    return c;
  }
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    unsigned char lo = b0 == 0xE0 ? 0xA0 : 0x80, hi = b0 == 0xED ? 0x9F : 0xBF;
    if (cont(i + 1, lo, hi) && cont(i + 2)) {
      char32_t c = ((b0 & 0x0Fu) << 12) | ((byte(i + 1) & 0x3Fu) << 6) | (byte(i + 2) & 0x3Fu);
      i += 3;
      return c;
    }
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    unsigned char lo = b0 == 0xF0 ? 0x90 : 0x80, hi = b0 == 0xF4 ? 0x8F : 0xBF;
    if (cont(i + 1, lo, hi) && cont(i + 2) && cont(i + 3)) {
      char32_t c = ((b0 & 0x07u) << 18) | ((byte(i + 1) & 0x3Fu) << 12) |
                   ((byte(i + 2) & 0x3Fu) << 6) | (byte(i + 3) & 0x3Fu);
      i += 4;
      return c;
    }
  }
  i += 1;
  return 0xDC00 + b0;  // surrogate escape of an undecodable byte
}

bool IsDirEntryAFolder(int dir_fd, const dirent* entry) {
  if (entry->d_type == DT_DIR) return true;
  if (entry->d_type != DT_LNK && entry->d_type != DT_UNKNOWN) return false;
  // Like Python's DirEntry.is_dir(): follow symlinks; a broken one is no folder.
  struct stat st;
  return ::fstatat(dir_fd, entry->d_name, &st, 0) == 0 && S_ISDIR(st.st_mode);
}

bool IsDotOrDotDot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// Lists the folder at `rel` (relative to `root_fd`) into folder and
// non-folder names, as os.scandir + is_dir do. `where` names it in errors.
// On success `*identity` is the folder's (device, inode).
Status ListFolder(int root_fd, const std::string& rel, const std::string& where,
                  std::vector<std::string>* folders, std::vector<std::string>* others,
                  std::pair<dev_t, ino_t>* identity) {
  UniqueFd fd(::openat(root_fd, rel.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(where + ": open folder", errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(where + ": stat folder", errno);
  *identity = {st.st_dev, st.st_ino};
  DIR* dir = ::fdopendir(fd.get());
  if (dir == nullptr) return ErrnoError(where + ": list folder", errno);
  const int dir_fd = fd.release();  // closedir closes it
  for (;;) {
    errno = 0;
    const dirent* entry = ::readdir(dir);
    if (entry == nullptr) break;
    if (IsDotOrDotDot(entry->d_name)) continue;
    (IsDirEntryAFolder(dir_fd, entry) ? folders : others)->emplace_back(entry->d_name);
  }
  int err = errno;
  ::closedir(dir);
  if (err != 0) return ErrnoError(where + ": list folder", err);
  return Status::Ok();
}

void SortPythonOrder(std::vector<std::string>& names) {
  std::sort(names.begin(), names.end(),
            [](const std::string& a, const std::string& b) { return PythonNameLess(a, b); });
}

// The images under one class folder, in torchvision's order: the walk's
// folders sorted by path, each folder's files sorted by name.
class ClassWalker {
 public:
  ClassWalker(int root_fd, const std::string& key_prefix)
      : root_fd_(root_fd), key_prefix_(key_prefix) {}

  // Walks `class_rel` and appends its images (paths relative to root) to
  // `samples` with `label`. Returns how many it found.
  Result<int64_t> Collect(const std::string& class_rel, int64_t label,
                          FileListSource::Builder& samples) {
    listings_.clear();
    ancestors_.clear();
    STOKER_RETURN_IF_ERROR(Walk(class_rel));
    std::sort(listings_.begin(), listings_.end(),
              [](const auto& a, const auto& b) { return PythonNameLess(a.first, b.first); });
    int64_t found = 0;
    std::string path;
    for (const auto& [rel, files] : listings_) {
      for (const std::string& file : files) {
        path.assign(rel).append("/").append(file);
        samples.Add(path, label);
        ++found;
      }
    }
    return found;
  }

 private:
  Status Walk(const std::string& rel) {
    std::vector<std::string> folders, files;
    std::pair<dev_t, ino_t> identity;
    STOKER_RETURN_IF_ERROR(
        ListFolder(root_fd_, rel, key_prefix_ + rel, &folders, &files, &identity));
    // A folder that is its own ancestor was reached through a symlink loop:
    // os.walk would recurse until the path grows too long; skip it instead.
    if (std::find(ancestors_.begin(), ancestors_.end(), identity) != ancestors_.end()) {
      return Status::Ok();
    }
    files.erase(std::remove_if(files.begin(), files.end(),
                               [](const std::string& f) { return !HasImageExtension(f); }),
                files.end());
    if (!files.empty()) {
      SortPythonOrder(files);
      listings_.emplace_back(rel, std::move(files));
    }
    ancestors_.push_back(identity);
    for (const std::string& folder : folders) {
      STOKER_RETURN_IF_ERROR(Walk(rel + "/" + folder));
    }
    ancestors_.pop_back();
    return Status::Ok();
  }

  int root_fd_;
  const std::string& key_prefix_;
  std::vector<std::pair<dev_t, ino_t>> ancestors_;
  std::vector<std::pair<std::string, std::vector<std::string>>> listings_;
};

std::string JoinNames(const std::vector<std::string>& names, const std::string& prefix) {
  constexpr size_t kShown = 10;
  std::string out;
  for (size_t i = 0; i < names.size() && i < kShown; ++i) {
    if (i > 0) out += ", ";
    out += prefix + names[i];
  }
  if (names.size() > kShown) out += " and " + std::to_string(names.size() - kShown) + " more";
  return out;
}

}  // namespace

bool PythonNameLess(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] == b[j] && static_cast<unsigned char>(a[i]) < 0x80) {
      ++i, ++j;
      continue;
    }
    char32_t ca = NextCodePoint(a, i), cb = NextCodePoint(b, j);
    if (ca != cb) return ca < cb;
  }
  return i == a.size() && j < b.size();
}

bool HasImageExtension(std::string_view name) {
  for (std::string_view ext : kImageExtensions) {
    if (name.size() < ext.size()) continue;
    std::string_view tail = name.substr(name.size() - ext.size());
    bool match = std::equal(tail.begin(), tail.end(), ext.begin(), [](char c, char e) {
      return (c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c) == e;
    });
    if (match) return true;
  }
  return false;
}

Result<std::shared_ptr<const Source>> OpenImageFolder(const std::string& root) {
  if (root.empty()) return InvalidArgument("image folder root is empty");
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string key_prefix = base == "/" ? base : base + "/";

  UniqueFd root_folder(::open(base.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root_folder.valid()) return ErrnoError(base + ": open image folder", errno);
  const int root_fd = root_folder.get();

  std::vector<std::string> classes, ignored;
  std::pair<dev_t, ino_t> identity;
  STOKER_RETURN_IF_ERROR(ListFolder(root_fd, ".", base, &classes, &ignored, &identity));
  if (classes.empty()) {
    return NotFound(base + ": found no class folder (expected <root>/<class>/<image>)");
  }
  SortPythonOrder(classes);

  FileListSource::Builder samples;
  ClassWalker walker(root_fd, key_prefix);
  std::vector<std::string> empty_classes;
  for (size_t label = 0; label < classes.size(); ++label) {
    STOKER_ASSIGN_OR_RETURN(int64_t found,
                            walker.Collect(classes[label], static_cast<int64_t>(label), samples));
    if (found == 0) empty_classes.push_back(classes[label]);
  }
  if (!empty_classes.empty()) {
    std::string extensions;
    for (std::string_view ext : kImageExtensions) extensions += std::string(ext) + " ";
    extensions.pop_back();
    return NotFound("found no valid image file (" + extensions + ") for the classes " +
                    JoinNames(empty_classes, "") + ": none in " +
                    JoinNames(empty_classes, key_prefix));
  }
  return FileListSource::Make(base, std::move(samples), std::move(classes));
}

}  // namespace stoker
