#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "stoker/probe.h"

// Test support: a fake machine as a file tree (proc, sys, cgroup) in a fresh
// temporary directory, plus the environment, /dev/shm space and rlimits that
// the probe takes through ProbeOptions. Used by the probe and advisor tests.

namespace stoker::hw {

class FakeMachine {
 public:
  /// Creates an empty tree; removes it on destruction.
  FakeMachine();
  ~FakeMachine();
  FakeMachine(const FakeMachine&) = delete;
  FakeMachine& operator=(const FakeMachine&) = delete;

  /// Writes `text` to `relative` under the root, creating its folders.
  void Write(const std::string& relative, const std::string& text);
  /// Makes `relative` a symbolic link to `target`.
  void Link(const std::string& relative, const std::string& target);
  std::string root() const { return root_; }

  /// `cpus` online CPUs, `threads_per_core` to a core, in /sys and /proc/cpuinfo.
  void AddHostCpus(int cpus, int threads_per_core, const std::string& model);
  /// Cpus_allowed_list in /proc/self/status.
  void SetAffinity(const std::string& cpu_list);
  void SetMeminfo(uint64_t total_bytes, uint64_t available_bytes);

  std::map<std::string, std::string> env;
  std::optional<FsSpace> shm;       // space of /dev/shm; nullopt: unreadable
  std::map<int, uint64_t> rlimits;  // absent: unlimited

  /// Options that read only this fake machine (never NVML).
  ProbeOptions Options() const;

 private:
  std::string root_;
};

// The machines the issue names, shared by the probe and advisor tests.

/// A Docker container (cgroup v2) on a 16-CPU host (8 cores x 2 threads): a
/// 1.5-core quota (cpu.max "150000 100000", the parent "max"), a 2 GiB memory
/// limit with 512 MiB used, 64 GiB host memory with 60 GiB available, a
/// 64 MiB /dev/shm, all 16 CPUs in the affinity mask.
void BuildQuotaContainerV2(FakeMachine& m);

/// A Kubernetes pod on cgroup v1 on a 16-CPU host: a 2.5-core quota on the
/// pod under a 4-core one on its parent, a 1 GiB memory limit with 256 MiB
/// used (the root says "unlimited" as v1 does), the affinity "0,2,5-7"
/// (5 CPUs), 32 GiB available, an 8 GiB /dev/shm, RLIMIT_NPROC 4096.
void BuildPodV1(FakeMachine& m);

/// A bare 16-CPU host (cgroup v2, cpu.max "max 100000" everywhere) whose
/// process is pinned to CPUs "0-3"; 16 GiB available, 8 GiB /dev/shm.
void BuildPinnedHost(FakeMachine& m);

/// Every file present, every one holding garbage.
void BuildGarbage(FakeMachine& m);

/// Block devices laid out in /sys as the kernel lays them out, each holding
/// one mount (/proc/self/mountinfo) named after what it is:
///   /virtio   vda1: virtio-blk under a PCI virtio device, rotational 1
///   /xen      xvda1: Xen's vbd, rotational 1
///   /vscsi    sda1: virtio-scsi (QEMU's), rotational 1
///   /hdd      sdb1: SATA, vendor "ATA", model "WDC WD40EFRX-68N", rotational 1
///   /qemu     sdc1: SATA emulated by QEMU (vendor "QEMU", "QEMU HARDDISK"), rotational 1
///   /hyperv   sdd1: vendor "Msft", model "Virtual Disk", rotational 1
///   /bare     sde1: rotational 1, no vendor or model in sysfs
///   /ssd      sdf1: SATA, vendor "ATA", model "Samsung SSD 870", rotational 0
///   /nvme     nvme0n1p1: rotational 0
///   /loop     loop0: rotational 1 (a file's image)
///   /lvm-vm   dm-0: device-mapper over vda2
///   /lvm-hdd  dm-1: device-mapper over sdb2
void BuildDisks(FakeMachine& m);

}  // namespace stoker::hw
