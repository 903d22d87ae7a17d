#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>
#include <type_traits>

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

std::optional<std::string> Canonical(const std::string& path) {
  std::unique_ptr<char, decltype(&::free)> real(::realpath(path.c_str(), nullptr), &::free);
  if (!real) return std::nullopt;
  return std::string(real.get());
}

std::string AbsolutePath(const std::string& path) {
  if (std::optional<std::string> real = Canonical(path)) return *real;
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

// The device holding `path` (stat's st_dev); nullopt when it cannot be
// stat'ed.
std::optional<dev_t> DeviceOf(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return st.st_dev;
}

// Without a mount table entry (a chroot, a container hiding the mount), the
// mount point is the highest folder above `path` on its device, as
// `stat --format=%m` finds it. REQUIRES: `path` absolute, without "." or
// ".." components.
std::optional<std::string> MountPointOnDevice(const std::string& path, dev_t device) {
  std::string mount_point = path;
  while (mount_point != "/") {
    const size_t slash = mount_point.rfind('/');
    if (slash == std::string::npos) return std::nullopt;
    std::string parent = slash == 0 ? "/" : mount_point.substr(0, slash);
    std::optional<dev_t> parent_device = DeviceOf(parent);
    if (!parent_device) return std::nullopt;
    if (*parent_device != device) break;
    mount_point = std::move(parent);
  }
  return mount_point;
}

// The file system's type from statfs's magic number, named as mountinfo
// names it; nullopt for one not listed here (its kind stays unknown).
std::optional<std::string> FsTypeOf(const std::string& path) {
  struct statfs fs;
  if (::statfs(path.c_str(), &fs) != 0) return std::nullopt;
  struct Magic {
    uint64_t magic;
    const char* name;
  };
  static constexpr Magic kMagics[] = {
      {0xEF53, "ext4"},  // ext2 and ext3 too: one magic
      {0x58465342, "xfs"},     {0x9123683E, "btrfs"}, {0x2FC12FC1, "zfs"},   {0xF2F52010, "f2fs"},
      {0x794C7630, "overlay"}, {0x01021994, "tmpfs"}, {0x858458F6, "ramfs"}, {0x6969, "nfs"},
      {0xFF534D42, "cifs"},    {0xFE534D42, "smb3"},  {0x00C36400, "ceph"},  {0x01021997, "9p"},
      {0x0BD00BD0, "lustre"},  {0x47504653, "gpfs"},  {0x65735546, "fuse"},  // virtiofs and every
                                                                             // FUSE file system
  };
  const auto magic =
      static_cast<uint64_t>(static_cast<std::make_unsigned_t<decltype(fs.f_type)>>(fs.f_type));
  for (const Magic& m : kMagics) {
    if (m.magic == magic) return m.name;
  }
  return std::nullopt;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool Contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// The disk's own sysfs folder for a block device's folder: a partition has
// no queue of its own, its parent disk's folder holds it.
std::string DiskFolder(const std::string& device_dir) {
  const bool partition =
      Exists(JoinPath(device_dir, "partition")) ||
      (!Exists(JoinPath(device_dir, "queue")) && Exists(JoinPath(device_dir, "../queue")));
  if (!partition) return device_dir;
  const size_t slash = device_dir.rfind('/');
  return slash == std::string::npos || slash == 0 ? device_dir : device_dir.substr(0, slash);
}

// A sysfs file's text, trimmed; empty when missing.
std::string ReadTrimmed(const std::string& path) {
  std::optional<std::string> text = ReadSmallFile(path, 4096);
  return text ? std::string(Trim(*text)) : std::string();
}

struct Disk {
  MachineFacts::DiskKind kind = MachineFacts::DiskKind::kUnknown;
  std::string evidence;
  std::optional<bool> rotational;
};

std::optional<bool> ReadRotational(const std::string& disk_dir, Notes& notes) {
  const std::string path = JoinPath(disk_dir, "queue/rotational");
  std::optional<std::string> text = ReadSmallFile(path);
  if (!text) return std::nullopt;
  std::optional<uint64_t> v = ParseUint(*text);
  if (!v || *v > 1) {
    notes.push_back(path + ": '" + std::string(Trim(text->substr(0, 64))) + "' is not 0 or 1");
    return std::nullopt;
  }
  return *v == 1;
}

// What makes a disk virtual, by its kernel name: a paravirtual driver's
// disk, or a block device with no hardware under it.
const char* VirtualByName(std::string_view name) {
  struct Prefix {
    std::string_view prefix;
    const char* what;
  };
  static constexpr Prefix kPrefixes[] = {
      {"xvd", "a Xen virtual disk"}, {"vd", "a virtio disk"},
      {"loop", "a loop device"},     {"nbd", "a network block device"},
      {"rbd", "a Ceph RBD device"},  {"zram", "a RAM disk"},
      {"ram", "a RAM disk"},
  };
  for (const Prefix& p : kPrefixes) {
    if (name.starts_with(p.prefix)) return p.what;
  }
  return nullptr;
}

// A hypervisor's bus in the disk's sysfs path (relative to /sys): virtio-scsi
// and virtio-blk sit under "virtioN", Xen's disks under "vbd-N", Hyper-V's
// under its VMBus.
const char* VirtualByPath(std::string_view sys_path) {
  const std::string lower = Lower(sys_path);
  if (Contains(lower, "/virtio")) return "on a virtio bus";
  if (Contains(lower, "/vbd-")) return "on Xen's virtual block bus";
  if (Contains(lower, "vmbus")) return "on Hyper-V's VMBus";
  return nullptr;
}

// A hypervisor's emulated disk, by the vendor and model it reports.
bool VirtualByVendor(std::string_view vendor, std::string_view model) {
  static constexpr std::string_view kVendors[] = {"qemu", "vmware", "msft",  "google", "amazon",
                                                  "vbox", "xen",    "bhyve", "virtual"};
  static constexpr std::string_view kModels[] = {"virtual", "qemu", "vbox", "persistentdisk",
                                                 "elastic block store"};
  const std::string v = Lower(vendor);
  const std::string m = Lower(model);
  for (std::string_view k : kVendors) {
    if (v.starts_with(k)) return true;
  }
  for (std::string_view k : kModels) {
    if (Contains(m, k)) return true;
  }
  return false;
}

std::string FlagText(const std::optional<bool>& rotational) {
  return rotational ? (*rotational ? "rotational flag 1" : "rotational flag 0")
                    : std::string("no rotational flag");
}

constexpr int kMaxStackDepth = 4;  // device-mapper over md over disks, say

// Classifies the disk whose sysfs folder is `disk_dir` (canonical). A
// device-mapper or md device is what its slaves are: virtual over any
// virtual one, else HDD or SSD when all agree.
Disk ClassifyDisk(const std::string& sys_root, const std::string& disk_dir, int depth,
                  Notes& notes) {
  using Kind = MachineFacts::DiskKind;
  Disk d;
  d.rotational = ReadRotational(disk_dir, notes);
  const std::string name = disk_dir.substr(disk_dir.rfind('/') + 1);
  const std::string flag = FlagText(d.rotational);
  auto verdict = [&](Kind kind, std::string why) {
    d.kind = kind;
    d.evidence = name + ": " + std::move(why);
    return d;
  };
  if (const char* what = VirtualByName(name)) return verdict(Kind::kVirtual, what);
  std::error_code ec;
  std::vector<std::string> slaves;
  for (const auto& entry : std::filesystem::directory_iterator(JoinPath(disk_dir, "slaves"), ec)) {
    if (std::optional<std::string> dir = Canonical(entry.path().string())) {
      slaves.push_back(DiskFolder(*dir));
    }
  }
  std::sort(slaves.begin(), slaves.end());
  if (!slaves.empty() && depth < kMaxStackDepth) {
    std::vector<Disk> under;
    for (const std::string& slave : slaves) {
      under.push_back(ClassifyDisk(sys_root, slave, depth + 1, notes));
    }
    std::string over;
    for (const Disk& u : under) over += (over.empty() ? "" : "; ") + u.evidence;
    auto all = [&](Kind kind) {
      return std::all_of(under.begin(), under.end(), [&](const Disk& u) { return u.kind == kind; });
    };
    const bool any_virtual = std::any_of(under.begin(), under.end(),
                                         [](const Disk& u) { return u.kind == Kind::kVirtual; });
    const Kind kind = any_virtual       ? Kind::kVirtual
                      : all(Kind::kHdd) ? Kind::kHdd
                      : all(Kind::kSsd) ? Kind::kSsd
                                        : Kind::kUnknown;
    return verdict(kind, "over " + over);
  }
  const std::string relative =
      disk_dir.starts_with(sys_root) ? disk_dir.substr(sys_root.size()) : disk_dir;
  if (const char* where = VirtualByPath(relative)) {
    return verdict(Kind::kVirtual, std::string("a disk ") + where + ", " + flag + " not trusted");
  }
  const std::string vendor = ReadTrimmed(JoinPath(disk_dir, "device/vendor"));
  const std::string model = ReadTrimmed(JoinPath(disk_dir, "device/model"));
  std::string identity;
  if (!vendor.empty()) identity += ", vendor " + vendor;
  if (!model.empty()) identity += ", model " + model;
  if (VirtualByVendor(vendor, model)) {
    return verdict(Kind::kVirtual,
                   "a hypervisor's emulated disk" + identity + ", " + flag + " not trusted");
  }
  if (Contains(relative, "/devices/virtual/")) {
    return verdict(Kind::kVirtual, "a block device without hardware, " + flag + " not trusted");
  }
  if (name.starts_with("nvme")) return verdict(Kind::kSsd, "an NVMe disk" + identity);
  if (!d.rotational) return verdict(Kind::kUnknown, flag + identity);
  if (!*d.rotational) return verdict(Kind::kSsd, flag + identity);
  // Set, on a disk that names its vendor and none of the above: a spinning
  // disk. Without a vendor nothing tells it from a virtual disk.
  if (vendor.empty()) {
    return verdict(Kind::kUnknown,
                   flag + ", but no vendor in sysfs to tell a real disk from a virtual one");
  }
  return verdict(Kind::kHdd, flag + identity);
}

// The disk under block device `device` ("major:minor"), by
// <sys_root>/dev/block/<device>; unknown when sysfs does not show it.
Disk ReadDisk(const ProbeOptions& o, const std::string& device, Notes& notes) {
  if (device.starts_with("0:")) return {};  // no block device (tmpfs, overlay, NFS)
  std::optional<std::string> dir = Canonical(JoinPath(o.sys_root, "dev/block/" + device));
  if (!dir) return {};
  const std::string sys_root = Canonical(o.sys_root).value_or(o.sys_root);
  return ClassifyDisk(sys_root, DiskFolder(*dir), 0, notes);
}

}  // namespace

MachineFacts::Storage ReadStorageFacts(const ProbeOptions& options, const std::string& path,
                                       Notes& notes) {
  MachineFacts::Storage storage;
  storage.path = AbsolutePath(path);
  // A store that is there but cannot be read (a FUSE server gone:
  // ENOTCONN; EIO) is said: its mount still reads as a healthy store.
  if (struct stat st{}; ::stat(storage.path.c_str(), &st) != 0 && errno != ENOENT) {
    notes.push_back(storage.path + ": " + std::strerror(errno) +
                    " (the data cannot be read there)");
  }
  const std::string mountinfo =
      ReadSmallFile(JoinPath(options.proc_root, "self/mountinfo"), 16 << 20).value_or("");
  std::optional<Mount> best;
  for (std::string_view line : SplitLines(mountinfo)) {
    std::optional<Mount> m = ParseMountLine(line);
    // A later mount on the same point hides the earlier one, hence >=.
    if (m && IsUnder(storage.path, m->mount_point) &&
        (!best || m->mount_point.size() >= best->mount_point.size())) {
      best = std::move(m);
    }
  }
  if (best) {
    storage.device = best->device;
    storage.mount_point = best->mount_point;
    storage.fs_type = best->fs_type;
    if (!best->source.empty()) storage.source = best->source;
  } else if (std::optional<dev_t> device = DeviceOf(storage.path)) {
    // No entry above the path (a chroot sees none for its root): the facts
    // come from the path itself.
    storage.device = std::to_string(major(*device)) + ":" + std::to_string(minor(*device));
    storage.mount_point = MountPointOnDevice(storage.path, *device);
    storage.fs_type = FsTypeOf(storage.path);
  }
  if (storage.fs_type) storage.kind = KindOf(*storage.fs_type);
  if (storage.device) {
    Disk disk = ReadDisk(options, *storage.device, notes);
    storage.rotational = disk.rotational;
    storage.disk = disk.kind;
    storage.disk_evidence = std::move(disk.evidence);
  }
  return storage;
}

}  // namespace stoker::hw
