#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

namespace stoker {

/// Facts about the machine that bound how many workers a loader may use.
///
/// A plain struct: every fact is read by one small function, and a fact that
/// cannot be read is left empty (unknown) rather than failing the probe. For
/// limits (a CPU quota, a memory limit, an rlimit) empty also means "no limit
/// found"; `notes` says when something was present but unreadable.
struct MachineFacts {
  struct Cpu {
    std::optional<int> logical;          // CPUs online on the host
    std::optional<int> physical_cores;   // distinct (package, core) pairs in /sys topology
    std::optional<int> affinity;         // CPUs this process may run on
    std::optional<double> quota_cores;   // tightest cgroup CPU quota, in cores
    std::optional<double> budget_cores;  // min(affinity, quota); logical if affinity unknown
    std::optional<std::string> model;
  };
  struct Memory {
    std::optional<uint64_t> total_bytes;           // MemTotal
    std::optional<uint64_t> available_bytes;       // MemAvailable
    std::optional<uint64_t> cgroup_limit_bytes;    // tightest cgroup memory limit
    std::optional<uint64_t> cgroup_current_bytes;  // use charged against that limit
    std::optional<uint64_t> cgroup_cache_bytes;    // of it, file cache the kernel reclaims
  };
  struct Shm {
    std::optional<uint64_t> size_bytes;
    std::optional<uint64_t> free_bytes;
  };
  struct Limits {
    std::optional<uint64_t> nproc;   // soft RLIMIT_NPROC; empty when unlimited
    std::optional<uint64_t> nofile;  // soft RLIMIT_NOFILE; empty when unlimited
    std::optional<bool> in_container;
  };
  /// Where the data lives: the mount holding `path`.
  enum class StorageKind { kUnknown, kLocal, kMemory, kNetwork, kFuse };
  /// The block device under a local mount, as far as sysfs shows it. A disk
  /// is kHdd only on evidence: the kernel's rotational flag set on a disk
  /// whose vendor says it is hardware (a SATA or SCSI disk). A virtual disk
  /// (virtio, Xen, Hyper-V, a hypervisor's emulated SCSI disk, loop, a
  /// device-mapper or md device over one) is kVirtual whatever its flag
  /// says: many hypervisors report rotational=1 for SSD-backed volumes.
  enum class DiskKind { kUnknown, kHdd, kSsd, kVirtual };
  struct Storage {
    std::string path;
    std::optional<std::string> device;  // "major:minor" of the mount
    std::optional<std::string> source;  // the mount's source, e.g. "/dev/nvme0n1p2"
    std::optional<std::string> mount_point;
    std::optional<std::string> fs_type;
    /// The kernel's queue/rotational flag of the block device (or its parent
    /// disk), as read: meaningless on a virtual disk (see `disk`).
    std::optional<bool> rotational;
    StorageKind kind = StorageKind::kUnknown;
    DiskKind disk = DiskKind::kUnknown;
    /// Why `disk` is what it is, for people: "vda: a virtio disk", "sda:
    /// rotational flag 1, vendor ATA, model WDC WD40EFRX". Empty without a
    /// block device (tmpfs, NFS, FUSE) or when sysfs shows none.
    std::string disk_evidence;
  };
  struct Gpu {
    int index = 0;
    std::optional<std::string> name;
    std::optional<uint64_t> memory_total_bytes;
    std::optional<uint64_t> memory_used_bytes;
    std::optional<int> utilization_percent;  // GPU busy time over NVML's last sample period
  };
  /// Where this process sits in a distributed job.
  struct Ranks {
    std::optional<int> rank;
    std::optional<int> local_rank;
    std::optional<int> world_size;
    std::optional<int> local_world_size;
    std::string launcher = "none";  // "torchrun", "openmpi" or "none" (a single process)
    /// Under a launcher whose rank or world size is unknown: which variable
    /// is missing or malformed, and its value ("$RANK is not set"); else empty.
    std::string problem;
  };

  Cpu cpu;
  Memory memory;
  Shm shm;
  Limits limits;
  std::optional<Storage> storage;  // only when a data path was given
  std::vector<Gpu> gpus;           // empty when NVML or a device is absent
  Ranks ranks;
  /// Facts that were present but could not be parsed, each naming the file
  /// or variable and what was found, e.g. "/sys/fs/cgroup/cpu.max: 'abc'".
  std::vector<std::string> notes;
};

/// "local", "memory", "network", "fuse" or "unknown".
const char* StorageKindName(MachineFacts::StorageKind kind);

/// "hdd", "ssd", "virtual" or "unknown" (the JSON's "disk").
const char* DiskKindName(MachineFacts::DiskKind kind);

/// The disk kind for people, one vocabulary for `stoker probe` and the
/// advisor: "HDD (rotational)", "SSD (not rotational)", "virtual (rotational
/// flag unreliable)" or "unknown".
const char* DiskKindLabel(MachineFacts::DiskKind kind);

/// `bytes` in binary units for people: "512 B", "64.0 MiB", "1.5 GiB".
std::string FormatBytes(uint64_t bytes);

/// Space of a file system, as statvfs reports it.
struct FsSpace {
  uint64_t size_bytes = 0;
  uint64_t free_bytes = 0;
};

/// Where the probe reads. Defaults describe the real machine; tests point the
/// roots at fixture trees and inject the environment and statvfs.
struct ProbeOptions {
  std::string proc_root = "/proc";
  std::string sys_root = "/sys";
  std::string cgroup_root = "/sys/fs/cgroup";
  /// Root of the file system for marker files (/.dockerenv, /run/.containerenv).
  std::string fs_root = "/";
  std::string shm_path = "/dev/shm";
  /// When set, the storage facts describe the mount holding this path.
  std::optional<std::string> data_path;
  /// Environment lookup; nullopt when unset. Empty means ::getenv.
  std::function<std::optional<std::string>(const std::string&)> getenv;
  /// Space of a path; nullopt when it cannot be read. Empty means statvfs.
  std::function<std::optional<FsSpace>(const std::string&)> space_of;
  /// Resource limits; empty means getrlimit on this process.
  std::function<std::optional<uint64_t>(int resource)> rlimit;  // nullopt: unlimited or unknown
  /// Skip NVML (it costs tens of milliseconds); gpus is then empty.
  bool skip_gpus = false;
};

/// Reads the machine facts. Never fails: unreadable facts are left unknown.
/// Cheap without GPUs (a few dozen small file reads); safe to call at any
/// time and from any thread, concurrently with other calls.
MachineFacts ProbeMachine(const ProbeOptions& options = {});

/// CPU time since boot on the CPUs this process may run on (its
/// Cpus_allowed_list), summed from <proc_root>/stat: busy is everything but
/// idle, iowait and steal. Differences over a window tell how busy those
/// CPUs were, and, less this process's own CPU time, how much other
/// processes used.
struct CpuTimes {
  double busy_s = 0;  // running something (this process or others)
  double idle_s = 0;  // idle or waiting for I/O
  // Taken by the hypervisor: lost to us however many threads we run, so
  // neither busy (other processes' load on our CPUs) nor idle.
  double steal_s = 0;
  int cpus = 0;
};
/// nullopt when the files cannot be read or parsed.
std::optional<CpuTimes> ReadCpuTimes(const ProbeOptions& options = {});

/// CPU time, in seconds, of this process's descendants alive now (children,
/// their children...: worker processes), read from <proc_root> as it runs --
/// unlike getrusage's, which counts children only once collected. 0 where
/// /proc does not list children.
double DescendantsCpuSeconds(const ProbeOptions& options = {});

/// This process's resident set size now (VmRSS of <proc_root>/self/status),
/// bytes; 0 if unknown. Cheap (one small file read); thread-safe.
size_t RssBytes(const ProbeOptions& options = {});
/// This process's peak resident set size (VmHWM), bytes; 0 if unknown.
size_t PeakRssBytes(const ProbeOptions& options = {});

/// The facts as JSON with stable keys, null for unknown:
/// {"cpu": {"logical", "physical_cores", "affinity", "quota_cores",
/// "budget_cores", "model"}, "memory": {"total_bytes", "available_bytes",
/// "cgroup_limit_bytes", "cgroup_current_bytes", "cgroup_cache_bytes"}, "shm": {"size_bytes",
/// "free_bytes"}, "limits": {"nproc", "nofile", "in_container"}, "storage":
/// {"path", "device", "source", "mount_point", "fs_type", "rotational" (the
/// kernel's flag, as read), "kind", "disk" (DiskKindName), "disk_evidence"}
/// or null, "gpus": [...], "ranks": {"rank", "local_rank",
/// "world_size", "local_world_size", "launcher"}, "notes": [...]}.
nlohmann::json FactsToJson(const MachineFacts& facts);

}  // namespace stoker
