#include <limits.h>
#include <stdlib.h>
#include <unistd.h>

#include <array>
#include <memory>

#include "hw/fact_readers.h"
#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

struct Mount {
  std::string device;  // "major:minor"
  std::string mount_point;
  std::string fs_type;
  std::string source;
};

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string Unescape(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    auto octal = [&](size_t k, char hi) { return field[k] >= '0' && field[k] <= hi; };
    if (field[i] == '\\' && i + 3 < field.size() && octal(i + 1, '3') && octal(i + 2, '7') &&
        octal(i + 3, '7')) {
      out.push_back(static_cast<char>((field[i + 1] - '0') * 64 + (field[i + 2] - '0') * 8 +
                                      (field[i + 3] - '0')));
      i += 3;
    } else {
      out.push_back(field[i]);
    }
  }
  return out;
}

std::vector<std::string_view> Fields(std::string_view line) {
  std::vector<std::string_view> fields;
  while (!line.empty()) {
    size_t start = line.find_first_not_of(' ');
    if (start == std::string_view::npos) break;
    line = line.substr(start);
    size_t end = line.find(' ');
    fields.push_back(line.substr(0, end));
    if (end == std::string_view::npos) break;
    line = line.substr(end);
  }
  return fields;
}

// "36 35 98:0 /mnt1 /mnt/parent rw,noatime master:1 - ext3 /dev/root rw"
std::optional<Mount> ParseMountLine(std::string_view line) {
  std::vector<std::string_view> f = Fields(line);
  if (f.size() < 7) return std::nullopt;
  size_t dash = 6;
  while (dash < f.size() && f[dash] != "-") ++dash;
  if (dash + 1 >= f.size() || f[4].empty() || f[4][0] != '/') return std::nullopt;
  Mount m;
  m.device = std::string(f[2]);
  m.mount_point = Unescape(f[4]);
  m.fs_type = std::string(f[dash + 1]);
  if (dash + 2 < f.size()) m.source = Unescape(f[dash + 2]);
  return m;
}

bool IsUnder(const std::string& path, const std::string& mount_point) {
  if (mount_point == "/") return true;
  return path == mount_point || (path.starts_with(mount_point) && path[mount_point.size()] == '/');
}

std::string AbsolutePath(const std::string& path) {
  std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr), &::free);
  if (real) return real.get();
  if (!path.empty() && path[0] == '/') return path;
  std::array<char, PATH_MAX> cwd{};
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) return path;
  return JoinPath(cwd.data(), path);
}

MachineFacts::StorageKind KindOf(const std::string& fs_type) {
  using Kind = MachineFacts::StorageKind;
  static constexpr std::array<std::string_view, 16> kNetwork = {
      "nfs", "nfs4", "cifs", "smb3",   "smbfs", "ceph",  "lustre",   "glusterfs",
      "9p",  "afs",  "gpfs", "beegfs", "panfs", "ncpfs", "virtiofs", "orangefs"};
  for (std::string_view n : kNetwork) {
    if (fs_type == n) return Kind::kNetwork;
  }
  if (fs_type == "fuse" || fs_type == "fuseblk" || fs_type.starts_with("fuse.")) return Kind::kFuse;
  if (fs_type == "tmpfs" || fs_type == "ramfs") return Kind::kMemory;
  return Kind::kLocal;
}

// A partition has no queue of its own; its parent disk's directory holds it.
std::optional<bool> ReadRotational(const ProbeOptions& o, const std::string& device, Notes& notes) {
  if (device.starts_with("0:")) return std::nullopt;  // no block device (tmpfs, overlay, NFS)
  std::string block = JoinPath(o.sys_root, "dev/block/" + device);
  for (const char* rel : {"queue/rotational", "../queue/rotational"}) {
    std::string path = JoinPath(block, rel);
    std::optional<std::string> text = ReadSmallFile(path);
    if (!text) continue;
    std::optional<uint64_t> v = ParseUint(*text);
    if (!v || *v > 1) {
      notes.push_back(path + ": '" + std::string(Trim(text->substr(0, 64))) + "' is not 0 or 1");
      return std::nullopt;
    }
    return *v == 1;
  }
  return std::nullopt;
}

}  // namespace

MachineFacts::Storage ReadStorageFacts(const ProbeOptions& options, const std::string& path,
                                       Notes& notes) {
  MachineFacts::Storage storage;
  storage.path = AbsolutePath(path);
  std::optional<std::string> mountinfo =
      ReadSmallFile(JoinPath(options.proc_root, "self/mountinfo"), 16 << 20);
  if (!mountinfo) return storage;
  std::optional<Mount> best;
  for (std::string_view line : SplitLines(*mountinfo)) {
    std::optional<Mount> m = ParseMountLine(line);
    // A later mount on the same point hides the earlier one, hence >=.
    if (m && IsUnder(storage.path, m->mount_point) &&
        (!best || m->mount_point.size() >= best->mount_point.size())) {
      best = std::move(m);
    }
  }
  if (!best) return storage;
  storage.device = best->device;
  storage.mount_point = best->mount_point;
  storage.fs_type = best->fs_type;
  if (!best->source.empty()) storage.source = best->source;
  storage.kind = KindOf(best->fs_type);
  storage.rotational = ReadRotational(options, best->device, notes);
  return storage;
}

}  // namespace stoker::hw
