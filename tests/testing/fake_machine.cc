#include "testing/fake_machine.h"

#include <stdlib.h>
#include <sys/resource.h>

#include <cassert>
#include <filesystem>
#include <fstream>
#include <system_error>
#include <vector>

#include "hw/sys_file.h"

namespace stoker::hw {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

}  // namespace

FakeMachine::FakeMachine() {
  std::string pattern = (std::filesystem::temp_directory_path() / "stoker-machine-XXXXXX").string();
  char* made = ::mkdtemp(pattern.data());
  assert(made != nullptr && "cannot create a temporary directory");
  (void)made;
  root_ = pattern;
}

FakeMachine::~FakeMachine() {
  std::error_code ignored;
  std::filesystem::remove_all(root_, ignored);
}

void FakeMachine::Write(const std::string& relative, const std::string& text) {
  std::filesystem::path path = JoinPath(root_, relative);
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

void FakeMachine::Link(const std::string& relative, const std::string& target) {
  std::filesystem::path path = JoinPath(root_, relative);
  std::filesystem::create_directories(path.parent_path());
  std::filesystem::create_directory_symlink(target, path);
}

void FakeMachine::AddHostCpus(int cpus, int threads_per_core, const std::string& model) {
  Write("sys/devices/system/cpu/online", "0-" + std::to_string(cpus - 1) + "\n");
  int cores = cpus / threads_per_core;
  std::string cpuinfo;
  for (int cpu = 0; cpu < cpus; ++cpu) {
    // Linux numbers the first thread of every core first: core c runs CPUs
    // c, c + cores, ...
    int core = cpu % cores;
    std::string siblings = std::to_string(core);
    for (int t = 1; t < threads_per_core; ++t) {
      siblings.push_back(',');
      siblings.append(std::to_string(core + t * cores));
    }
    Write("sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/core_cpus_list",
          siblings + "\n");
    cpuinfo += "processor\t: " + std::to_string(cpu) + "\nmodel name\t: " + model + "\n\n";
  }
  Write("proc/cpuinfo", cpuinfo);
}

void FakeMachine::SetAffinity(const std::string& cpu_list) {
  Write("proc/self/status", "Name:\ttest\nCpus_allowed:\tffff\nCpus_allowed_list:\t" + cpu_list +
                                "\nMems_allowed_list:\t0\n");
}

void FakeMachine::SetMeminfo(uint64_t total_bytes, uint64_t available_bytes) {
  Write("proc/meminfo", "MemTotal:       " + std::to_string(total_bytes / 1024) +
                            " kB\nMemFree:        1024 kB\nMemAvailable:   " +
                            std::to_string(available_bytes / 1024) + " kB\n");
}

ProbeOptions FakeMachine::Options() const {
  ProbeOptions o;
  o.proc_root = JoinPath(root_, "proc");
  o.sys_root = JoinPath(root_, "sys");
  o.cgroup_root = JoinPath(root_, "sys/fs/cgroup");
  o.fs_root = root_;
  o.shm_path = "/dev/shm";
  o.getenv = [env = env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    return it == env.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  o.space_of = [shm = shm](const std::string& path) -> std::optional<FsSpace> {
    return path == "/dev/shm" ? shm : std::nullopt;
  };
  o.rlimit = [limits = rlimits](int resource) -> std::optional<uint64_t> {
    auto it = limits.find(resource);
    return it == limits.end() ? std::nullopt : std::optional<uint64_t>(it->second);
  };
  o.skip_gpus = true;
  return o;
}

void BuildQuotaContainerV2(FakeMachine& m) {
  m.AddHostCpus(16, 2, "Fake CPU @ 3.0GHz");
  m.SetAffinity("0-15");
  m.SetMeminfo(64 * kGiB, 60 * kGiB);
  m.Write("proc/self/cgroup", "0::/docker/abc123\n");
  m.Write("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory pids\n");
  m.Write("sys/fs/cgroup/docker/cpu.max", "max 100000\n");
  m.Write("sys/fs/cgroup/docker/abc123/cpu.max", "150000 100000\n");
  m.Write("sys/fs/cgroup/docker/memory.max", "max\n");
  m.Write("sys/fs/cgroup/docker/abc123/memory.max", std::to_string(2 * kGiB) + "\n");
  m.Write("sys/fs/cgroup/docker/abc123/memory.current", std::to_string(512 * kMiB) + "\n");
  m.shm = FsSpace{64 * kMiB, 64 * kMiB};
}

void BuildPodV1(FakeMachine& m) {
  m.AddHostCpus(16, 2, "Fake CPU @ 3.0GHz");
  m.SetAffinity("0,2,5-7");
  m.SetMeminfo(64 * kGiB, 32 * kGiB);
  m.Write("proc/self/cgroup",
          "12:pids:/kubepods/pod1\n4:memory:/kubepods/pod1\n3:cpu,cpuacct:/kubepods/pod1\n"
          "1:name=systemd:/kubepods/pod1\n0::/\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_quota_us", "400000\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_period_us", "100000\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", "250000\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_period_us", "100000\n");
  m.Write("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
  m.Write("sys/fs/cgroup/memory/kubepods/pod1/memory.limit_in_bytes", std::to_string(kGiB) + "\n");
  m.Write("sys/fs/cgroup/memory/kubepods/pod1/memory.usage_in_bytes",
          std::to_string(256 * kMiB) + "\n");
  m.shm = FsSpace{8 * kGiB, 8 * kGiB};
  m.rlimits[RLIMIT_NPROC] = 4096;
}

void BuildPinnedHost(FakeMachine& m) {
  m.AddHostCpus(16, 2, "Fake CPU @ 3.0GHz");
  m.SetAffinity("0-3");
  m.SetMeminfo(32 * kGiB, 16 * kGiB);
  m.Write("proc/self/cgroup", "0::/user.slice/session-1.scope\n");
  m.Write("sys/fs/cgroup/user.slice/cpu.max", "max 100000\n");
  m.Write("sys/fs/cgroup/user.slice/session-1.scope/cpu.max", "max 100000\n");
  m.Write("sys/fs/cgroup/user.slice/session-1.scope/memory.max", "max\n");
  m.Write("sys/fs/cgroup/user.slice/session-1.scope/memory.current", "1048576\n");
  m.shm = FsSpace{8 * kGiB, 8 * kGiB};
}

void BuildGarbage(FakeMachine& m) {
  m.Write("sys/devices/system/cpu/online", "lots\n");
  m.Write("sys/devices/system/cpu/cpu0/topology/core_cpus_list", "zero\n");
  m.Write("proc/cpuinfo", "flags\t: fpu\n");
  m.SetAffinity("x-y");
  m.Write("proc/meminfo", "MemTotal: many kB\nMemAvailable: -5 kB\n");
  m.Write("proc/self/cgroup", "0::/garbage\nnot a cgroup line\n");
  m.Write("sys/fs/cgroup/garbage/cpu.max", "150000 0\n");
  m.Write("sys/fs/cgroup/cpu.max", "lots 100000\n");
  m.Write("sys/fs/cgroup/garbage/memory.max", "two gigabytes\n");
  m.Write("sys/fs/cgroup/garbage/memory.current", "some\n");
  m.env["RANK"] = "abc";
  m.env["WORLD_SIZE"] = "0";
  m.env["LOCAL_RANK"] = "1";
  m.env["LOCAL_WORLD_SIZE"] = "-2";
  m.shm = std::nullopt;
}

namespace {

// A disk at `folder` (under sys/devices) numbered `major`, with partitions
// 1 and 2 linked from /sys/dev/block, its rotational flag, and, when
// `vendor` is set, the SCSI device that names its vendor and model, as
// block/<disk>/device links to it.
void AddDisk(FakeMachine& m, const std::string& folder, int major, const std::string& rotational,
             const std::string& vendor = "", const std::string& model = "") {
  const std::string disk = "sys/devices/" + folder;
  const std::string name = folder.substr(folder.rfind('/') + 1);
  m.Write(disk + "/queue/rotational", rotational + "\n");
  for (int part : {1, 2}) {
    const std::string partition =
        name + (name.starts_with("nvme") ? "p" : "") + std::to_string(part);
    m.Write(disk + "/" + partition + "/partition", std::to_string(part) + "\n");
    // /sys/dev/block/<major:minor> -> ../../devices/<folder>/<partition>
    m.Link("sys/dev/block/" + std::to_string(major) + ":" + std::to_string(part),
           "../../devices/" + folder + "/" + partition);
  }
  if (!vendor.empty()) {
    // block/<disk>/device -> ../../../H:C:T:L, the SCSI device's folder.
    const std::string scsi = folder.substr(0, folder.rfind("/block/"));
    m.Write("sys/devices/" + scsi + "/vendor", vendor + "\n");
    m.Write("sys/devices/" + scsi + "/model", model + "\n");
    m.Link(disk + "/device", "../../../" + scsi.substr(scsi.rfind('/') + 1));
  }
}

// A virtual block device (loop, device-mapper) numbered major:0 over
// `slaves` (sys/devices-relative partition folders).
void AddVirtualBlock(FakeMachine& m, const std::string& name, int major,
                     const std::vector<std::string>& slaves) {
  const std::string dev = "sys/devices/virtual/block/" + name;
  m.Write(dev + "/queue/rotational", "1\n");
  for (const std::string& slave : slaves) {
    const std::string part = slave.substr(slave.rfind('/') + 1);
    m.Link(dev + "/slaves/" + part, "../../../../" + slave);
  }
  m.Link("sys/dev/block/" + std::to_string(major) + ":0", "../../devices/virtual/block/" + name);
}

}  // namespace

void BuildDisks(FakeMachine& m) {
  const std::string ata = "pci0000:00/0000:00:1f.2/ata";
  AddDisk(m, "pci0000:00/0000:00:05.0/virtio2/block/vda", 252, "1");
  AddDisk(m, "vbd-51712/block/xvda", 202, "1");
  AddDisk(m, "pci0000:00/0000:00:04.0/virtio1/host0/target0:0:0/0:0:0:0/block/sda", 8, "1",
          "QEMU    ", "QEMU HARDDISK");
  AddDisk(m, ata + "1/host1/target1:0:0/1:0:0:0/block/sdb", 9, "1", "ATA     ", "WDC WD40EFRX-68N");
  AddDisk(m, ata + "2/host2/target2:0:0/2:0:0:0/block/sdc", 10, "1", "QEMU    ", "QEMU HARDDISK");
  AddDisk(m, ata + "3/host3/target3:0:0/3:0:0:0/block/sdd", 11, "1", "Msft    ", "Virtual Disk");
  AddDisk(m, ata + "4/host4/target4:0:0/4:0:0:0/block/sde", 12, "1");
  AddDisk(m, ata + "5/host5/target5:0:0/5:0:0:0/block/sdf", 13, "0", "ATA     ", "Samsung SSD 870");
  AddDisk(m, "pci0000:00/0000:00:1d.0/nvme/nvme0/nvme0n1", 259, "0");
  AddVirtualBlock(m, "loop0", 7, {});
  AddVirtualBlock(m, "dm-0", 253, {"pci0000:00/0000:00:05.0/virtio2/block/vda/vda2"});
  AddVirtualBlock(m, "dm-1", 254, {ata + "1/host1/target1:0:0/1:0:0:0/block/sdb/sdb2"});
  m.Write("proc/self/mountinfo",
          "22 1 0:30 / / rw - overlay overlay rw\n"
          "30 22 252:1 / /virtio rw - ext4 /dev/vda1 rw\n"
          "31 22 202:1 / /xen rw - ext4 /dev/xvda1 rw\n"
          "32 22 8:1 / /vscsi rw - ext4 /dev/sda1 rw\n"
          "33 22 9:1 / /hdd rw - ext4 /dev/sdb1 rw\n"
          "34 22 10:1 / /qemu rw - ext4 /dev/sdc1 rw\n"
          "35 22 11:1 / /hyperv rw - ext4 /dev/sdd1 rw\n"
          "36 22 12:1 / /bare rw - ext4 /dev/sde1 rw\n"
          "37 22 13:1 / /ssd rw - ext4 /dev/sdf1 rw\n"
          "38 22 259:1 / /nvme rw - xfs /dev/nvme0n1p1 rw\n"
          "39 22 7:0 / /loop rw - ext4 /dev/loop0 rw\n"
          "40 22 253:0 / /lvm-vm rw - xfs /dev/mapper/vg-data rw\n"
          "41 22 254:0 / /lvm-hdd rw - xfs /dev/mapper/vg-hdd rw\n");
}

}  // namespace stoker::hw
