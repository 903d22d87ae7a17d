#include "stoker/probe.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "testing/fake_machine.h"

namespace stoker::hw {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;

bool NotesMention(const MachineFacts& facts, const std::string& text) {
  for (const std::string& note : facts.notes) {
    if (note.find(text) != std::string::npos) return true;
  }
  return false;
}

TEST(ProbeTest, CgroupV2ContainerWithQuotaAndMemoryLimit) {
  FakeMachine m;
  BuildQuotaContainerV2(m);
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_EQ(f.cpu.logical, 16);
  EXPECT_EQ(f.cpu.physical_cores, 8);
  EXPECT_EQ(f.cpu.affinity, 16);
  ASSERT_TRUE(f.cpu.quota_cores);
  EXPECT_DOUBLE_EQ(*f.cpu.quota_cores, 1.5);
  ASSERT_TRUE(f.cpu.budget_cores);
  EXPECT_DOUBLE_EQ(*f.cpu.budget_cores, 1.5);
  EXPECT_EQ(f.cpu.model, "Fake CPU @ 3.0GHz");
  EXPECT_EQ(f.memory.total_bytes, 64 * kGiB);
  EXPECT_EQ(f.memory.available_bytes, 60 * kGiB);
  EXPECT_EQ(f.memory.cgroup_limit_bytes, 2 * kGiB);
  EXPECT_EQ(f.memory.cgroup_current_bytes, 512 * kMiB);
  EXPECT_EQ(f.shm.size_bytes, 64 * kMiB);
  EXPECT_EQ(f.shm.free_bytes, 64 * kMiB);
  EXPECT_EQ(f.limits.in_container, true);  // the cgroup path names docker
  EXPECT_FALSE(f.limits.nproc);
  EXPECT_FALSE(f.storage);
  EXPECT_TRUE(f.gpus.empty());
  EXPECT_EQ(f.ranks.launcher, "none");
  EXPECT_EQ(f.ranks.rank, 0);
  EXPECT_EQ(f.ranks.world_size, 1);
  EXPECT_TRUE(f.notes.empty());
}

TEST(ProbeTest, CgroupV2TakesTheTightestQuotaOnThePathToTheRoot) {
  FakeMachine m;
  BuildQuotaContainerV2(m);
  m.Write("sys/fs/cgroup/docker/cpu.max", "100000 100000\n");        // 1 core above
  m.Write("sys/fs/cgroup/docker/abc123/memory.max", "max\n");        // none at the leaf
  m.Write("sys/fs/cgroup/docker/memory.max", std::to_string(kGiB));  // 1 GiB above
  m.Write("sys/fs/cgroup/docker/memory.current", std::to_string(kMiB));
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_DOUBLE_EQ(f.cpu.quota_cores.value_or(-1), 1.0);
  EXPECT_DOUBLE_EQ(f.cpu.budget_cores.value_or(-1), 1.0);
  EXPECT_EQ(f.memory.cgroup_limit_bytes, kGiB);
  EXPECT_EQ(f.memory.cgroup_current_bytes, kMiB);  // charged where the limit is
}

TEST(ProbeTest, CgroupV1PodWithQuotaAffinityAndUnlimitedRoot) {
  FakeMachine m;
  BuildPodV1(m);
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_EQ(f.cpu.logical, 16);
  EXPECT_EQ(f.cpu.affinity, 5);  // "0,2,5-7"
  EXPECT_DOUBLE_EQ(f.cpu.quota_cores.value_or(-1), 2.5);
  EXPECT_DOUBLE_EQ(f.cpu.budget_cores.value_or(-1), 2.5);
  EXPECT_EQ(f.memory.cgroup_limit_bytes, kGiB);  // the root's 2^63 means no limit
  EXPECT_EQ(f.memory.cgroup_current_bytes, 256 * kMiB);
  EXPECT_EQ(f.memory.available_bytes, 32 * kGiB);
  EXPECT_EQ(f.limits.nproc, 4096u);
  EXPECT_EQ(f.limits.in_container, true);  // kubepods
  EXPECT_TRUE(f.notes.empty());
}

TEST(ProbeTest, CgroupV1UnlimitedQuotaIsNoQuota) {
  FakeMachine m;
  BuildPodV1(m);
  m.Write("sys/fs/cgroup/cpu,cpuacct/kubepods/cpu.cfs_quota_us", "-1\n");
  m.Write("sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/cpu.cfs_quota_us", "-1\n");
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_FALSE(f.cpu.quota_cores);
  EXPECT_DOUBLE_EQ(f.cpu.budget_cores.value_or(-1), 5.0);  // the affinity
}

TEST(ProbeTest, CgroupV1HierarchyFoundUnderItsControllerName) {
  FakeMachine m;
  BuildPodV1(m);
  // Some hosts mount the hierarchy as "cpu" only.
  std::filesystem::rename(m.root() + "/sys/fs/cgroup/cpu,cpuacct", m.root() + "/sys/fs/cgroup/cpu");
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_DOUBLE_EQ(f.cpu.quota_cores.value_or(-1), 2.5);
}

TEST(ProbeTest, MaxQuotaMeansUnlimitedAndRestrictedAffinityBounds) {
  FakeMachine m;
  BuildPinnedHost(m);
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_EQ(f.cpu.logical, 16);
  EXPECT_EQ(f.cpu.affinity, 4);
  EXPECT_FALSE(f.cpu.quota_cores);
  EXPECT_DOUBLE_EQ(f.cpu.budget_cores.value_or(-1), 4.0);
  EXPECT_FALSE(f.memory.cgroup_limit_bytes);
  EXPECT_EQ(f.memory.cgroup_current_bytes, kMiB);
  EXPECT_EQ(f.limits.in_container, false);
  EXPECT_TRUE(f.notes.empty());
}

TEST(ProbeTest, MissingFilesAreUnknownWithoutNotes) {
  FakeMachine m;
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_FALSE(f.cpu.logical);
  EXPECT_FALSE(f.cpu.physical_cores);
  EXPECT_FALSE(f.cpu.affinity);
  EXPECT_FALSE(f.cpu.quota_cores);
  EXPECT_FALSE(f.cpu.budget_cores);
  EXPECT_FALSE(f.cpu.model);
  EXPECT_FALSE(f.memory.total_bytes);
  EXPECT_FALSE(f.memory.available_bytes);
  EXPECT_FALSE(f.memory.cgroup_limit_bytes);
  EXPECT_FALSE(f.memory.cgroup_current_bytes);
  EXPECT_FALSE(f.shm.size_bytes);
  EXPECT_FALSE(f.limits.nproc);
  EXPECT_EQ(f.limits.in_container, false);
  EXPECT_EQ(f.ranks.local_world_size, 1);
  EXPECT_TRUE(f.notes.empty());
}

TEST(ProbeTest, GarbageIsUnknownAndNoted) {
  FakeMachine m;
  BuildGarbage(m);
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_FALSE(f.cpu.logical);
  EXPECT_FALSE(f.cpu.physical_cores);
  EXPECT_FALSE(f.cpu.affinity);
  EXPECT_FALSE(f.cpu.quota_cores);
  EXPECT_FALSE(f.cpu.budget_cores);
  EXPECT_FALSE(f.cpu.model);
  EXPECT_FALSE(f.memory.total_bytes);
  EXPECT_FALSE(f.memory.available_bytes);
  EXPECT_FALSE(f.memory.cgroup_limit_bytes);
  EXPECT_FALSE(f.memory.cgroup_current_bytes);
  EXPECT_FALSE(f.shm.size_bytes);
  EXPECT_FALSE(f.shm.free_bytes);
  EXPECT_EQ(f.ranks.launcher, "torchrun");
  EXPECT_FALSE(f.ranks.rank);
  EXPECT_FALSE(f.ranks.world_size);
  EXPECT_EQ(f.ranks.local_rank, 1);
  EXPECT_FALSE(f.ranks.local_world_size);
  EXPECT_TRUE(NotesMention(f, "garbage/cpu.max"));
  EXPECT_TRUE(NotesMention(f, "cgroup/cpu.max: 'lots 100000'"));
  EXPECT_TRUE(NotesMention(f, "memory.max: 'two gigabytes'"));
  EXPECT_TRUE(NotesMention(f, "memory.current: 'some'"));
  EXPECT_TRUE(NotesMention(f, "MemTotal 'many kB'"));
  EXPECT_TRUE(NotesMention(f, "Cpus_allowed_list 'x-y'"));
  EXPECT_TRUE(NotesMention(f, "$RANK: 'abc'"));
  EXPECT_TRUE(NotesMention(f, "$WORLD_SIZE: '0'"));
  EXPECT_EQ(f.ranks.problem, "$RANK: 'abc' is not an integer >= 0");  // the first, for errors
}

TEST(ProbeTest, CpuTimesCountOnlyTheAllowedCpus) {
  FakeMachine m;
  m.SetAffinity("1,3");
  const double tick = 1.0 / static_cast<double>(::sysconf(_SC_CLK_TCK));
  // user nice system idle iowait irq softirq steal guest guest_nice
  m.Write("proc/stat",
          "cpu  4000 0 400 4000 40 0 0 0 0 0\n"
          "cpu0 1000 0 100 1000 10 0 0 0 0 0\n"
          "cpu1 200 10 20 700 30 5 5 30 0 0\n"
          "cpu2 1000 0 100 1000 10 0 0 0 0 0\n"
          "cpu3 50 0 50 900 0 0 0 0 0 0\n"
          "intr 1 2 3\nctxt 42\n");
  std::optional<CpuTimes> t = ReadCpuTimes(m.Options());
  ASSERT_TRUE(t);
  EXPECT_EQ(t->cpus, 2);
  EXPECT_NEAR(t->busy_s, (240 + 100) * tick, 1e-9);
  EXPECT_NEAR(t->steal_s, 30 * tick, 1e-9);          // neither busy nor idle
  EXPECT_NEAR(t->idle_s, (730 + 900) * tick, 1e-9);  // iowait counts as idle
}

TEST(ProbeTest, CpuTimesUnknownWithoutTheirFiles) {
  FakeMachine m;
  m.SetAffinity("0");
  EXPECT_FALSE(ReadCpuTimes(m.Options()));  // no proc/stat
  m.Write("proc/stat", "cpu0 garbage\n");
  EXPECT_FALSE(ReadCpuTimes(m.Options()));
  m.Write("proc/stat", "cpu1 1 2 3 4 5 6 7 8 0 0\n");  // none of ours
  EXPECT_FALSE(ReadCpuTimes(m.Options()));
}

TEST(ProbeTest, ResidentSetSizesComeFromSelfStatus) {
  FakeMachine m;
  EXPECT_EQ(RssBytes(m.Options()), 0u);  // no proc/self/status: unknown
  m.Write("proc/self/status", "Name:\ttest\nVmHWM:\t  2048 kB\nVmRSS:\t  1024 kB\n");
  EXPECT_EQ(RssBytes(m.Options()), 1024u * 1024);
  EXPECT_EQ(PeakRssBytes(m.Options()), 2048u * 1024);
  m.Write("proc/self/status", "VmRSS:\tmany kB\n");
  EXPECT_EQ(RssBytes(m.Options()), 0u);
  EXPECT_EQ(PeakRssBytes(m.Options()), 0u);
  EXPECT_GT(PeakRssBytes(), 0u);  // this process's, from /proc
}

TEST(ProbeTest, TorchrunVariables) {
  FakeMachine m;
  m.env = {{"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}};
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_EQ(f.ranks.launcher, "torchrun");
  EXPECT_EQ(f.ranks.rank, 5);
  EXPECT_EQ(f.ranks.local_rank, 1);
  EXPECT_EQ(f.ranks.world_size, 8);
  EXPECT_EQ(f.ranks.local_world_size, 4);
  EXPECT_EQ(f.ranks.problem, "");
  // A launcher's world without its rank, or a rank outside it, is a problem
  // to name: every process taking rank 0 would read the same part.
  m.env = {{"WORLD_SIZE", "4"}};
  EXPECT_EQ(ProbeMachine(m.Options()).ranks.problem, "$RANK is not set");
  m.env = {{"RANK", "4"}, {"WORLD_SIZE", "4"}};
  EXPECT_EQ(ProbeMachine(m.Options()).ranks.problem, "$RANK 4 is not below $WORLD_SIZE 4");
}

TEST(ProbeTest, OpenMpiVariables) {
  FakeMachine m;
  m.env = {{"OMPI_COMM_WORLD_RANK", "3"},
           {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
           {"OMPI_COMM_WORLD_SIZE", "16"},
           {"OMPI_COMM_WORLD_LOCAL_SIZE", "8"}};
  MachineFacts f = ProbeMachine(m.Options());
  EXPECT_EQ(f.ranks.launcher, "openmpi");
  EXPECT_EQ(f.ranks.rank, 3);
  EXPECT_EQ(f.ranks.local_rank, 3);
  EXPECT_EQ(f.ranks.world_size, 16);
  EXPECT_EQ(f.ranks.local_world_size, 8);
}

TEST(ProbeTest, ContainerMarkerFilesAndVariable) {
  {
    FakeMachine m;
    m.Write(".dockerenv", "");
    EXPECT_EQ(ProbeMachine(m.Options()).limits.in_container, true);
  }
  {
    FakeMachine m;
    m.Write("run/.containerenv", "");
    EXPECT_EQ(ProbeMachine(m.Options()).limits.in_container, true);
  }
  {
    FakeMachine m;
    m.env["container"] = "podman";
    EXPECT_EQ(ProbeMachine(m.Options()).limits.in_container, true);
  }
}

// A mount table with a local disk (rotational), an NVMe partition (whose
// queue sits on its parent disk), NFS, FUSE, tmpfs and an escaped space.
void BuildMounts(FakeMachine& m) {
  m.Write("proc/self/mountinfo",
          "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
          "23 22 0:21 / /proc rw - proc proc rw\n"
          "30 22 259:2 / /fast rw,noatime shared:5 - xfs /dev/nvme0n1p2 rw\n"
          "31 22 0:50 / /fast/nfs rw - nfs4 server:/export rw,vers=4.2\n"
          "32 22 0:51 / /remote rw,nosuid - fuse.sshfs user@host:/data rw\n"
          "33 22 0:52 / /ram rw - tmpfs tmpfs rw,size=1g\n"
          "34 22 8:17 / /my\\040disk rw - ext4 /dev/sdb1 rw\n"
          "35 22 8:1 / /remote/over rw - ext4 /dev/sda1 rw\n");
  // /sys/dev/block/MAJ:MIN links to the device; a partition's own folder has
  // no queue.
  m.Write("sys/devices/sda/queue/rotational", "1\n");
  m.Write("sys/devices/sda/sda1/partition", "1\n");
  m.Link("sys/dev/block/8:1", "../../devices/sda/sda1");
  m.Write("sys/devices/nvme0n1/queue/rotational", "0\n");
  m.Write("sys/devices/nvme0n1/nvme0n1p2/partition", "2\n");
  m.Link("sys/dev/block/259:2", "../../devices/nvme0n1/nvme0n1p2");
  m.Write("sys/devices/sdb/queue/rotational", "garbage\n");
  m.Write("sys/devices/sdb/sdb1/partition", "1\n");
  m.Link("sys/dev/block/8:17", "../../devices/sdb/sdb1");
}

MachineFacts::Storage ProbeStorage(FakeMachine& m, const std::string& path) {
  ProbeOptions o = m.Options();
  o.data_path = path;
  MachineFacts f = ProbeMachine(o);
  EXPECT_TRUE(f.storage);
  return f.storage.value_or(MachineFacts::Storage{});
}

TEST(ProbeTest, StorageKindFromTheLongestMountPrefix) {
  FakeMachine m;
  BuildMounts(m);
  using Kind = MachineFacts::StorageKind;

  MachineFacts::Storage disk = ProbeStorage(m, "/stoker-fixture/imagenet");
  EXPECT_EQ(disk.mount_point, "/");
  EXPECT_EQ(disk.device, "8:1");
  EXPECT_EQ(disk.source, "/dev/sda1");
  EXPECT_EQ(disk.fs_type, "ext4");
  EXPECT_EQ(disk.kind, Kind::kLocal);
  EXPECT_EQ(disk.rotational, true);

  MachineFacts::Storage nvme = ProbeStorage(m, "/fast/train");
  EXPECT_EQ(nvme.mount_point, "/fast");
  EXPECT_EQ(nvme.fs_type, "xfs");
  EXPECT_EQ(nvme.kind, Kind::kLocal);
  EXPECT_EQ(nvme.rotational, false);

  MachineFacts::Storage nfs = ProbeStorage(m, "/fast/nfs/train");
  EXPECT_EQ(nfs.mount_point, "/fast/nfs");
  EXPECT_EQ(nfs.kind, Kind::kNetwork);
  EXPECT_FALSE(nfs.rotational);

  EXPECT_EQ(ProbeStorage(m, "/fast/nfsish").mount_point, "/fast");  // not a path prefix
  EXPECT_EQ(ProbeStorage(m, "/remote/x").kind, Kind::kFuse);
  EXPECT_EQ(ProbeStorage(m, "/remote/over/x").kind, Kind::kLocal);
  EXPECT_EQ(ProbeStorage(m, "/ram/x").kind, Kind::kMemory);

  MachineFacts::Storage spaced = ProbeStorage(m, "/my disk/x");
  EXPECT_EQ(spaced.mount_point, "/my disk");
  EXPECT_FALSE(spaced.rotational);  // garbage in its queue/rotational
}

// A disk is an HDD only on evidence: its rotational flag set and a
// hardware vendor in sysfs. A virtual disk's flag (virtio, Xen, Hyper-V,
// QEMU's emulated disks, loop, device-mapper over one) is kept as read but
// decides nothing: many hypervisors set it on SSD-backed volumes.
TEST(ProbeTest, DiskKindNeedsEvidenceBeyondTheRotationalFlag) {
  FakeMachine m;
  BuildDisks(m);
  using Disk = MachineFacts::DiskKind;
  struct Case {
    const char* mount;
    Disk disk;
    std::optional<bool> rotational;
    const char* evidence;
  };
  const Case cases[] = {
      {"/virtio", Disk::kVirtual, true, "vda: a virtio disk"},
      {"/xen", Disk::kVirtual, true, "xvda: a Xen virtual disk"},
      {"/vscsi", Disk::kVirtual, true,
       "sda: a disk on a virtio bus, rotational flag 1 not trusted"},
      {"/hdd", Disk::kHdd, true, "sdb: rotational flag 1, vendor ATA, model WDC WD40EFRX-68N"},
      {"/qemu", Disk::kVirtual, true, "sdc: a hypervisor's emulated disk, vendor QEMU"},
      {"/hyperv", Disk::kVirtual, true, "sdd: a hypervisor's emulated disk, vendor Msft"},
      {"/bare", Disk::kUnknown, true, "sde: rotational flag 1, but no vendor in sysfs"},
      {"/ssd", Disk::kSsd, false, "sdf: rotational flag 0, vendor ATA, model Samsung SSD 870"},
      {"/nvme", Disk::kSsd, false, "nvme0n1: an NVMe disk"},
      {"/loop", Disk::kVirtual, true, "loop0: a loop device"},
      {"/lvm-vm", Disk::kVirtual, true, "dm-0: over vda: a virtio disk"},
      {"/lvm-hdd", Disk::kHdd, true, "dm-1: over sdb: rotational flag 1, vendor ATA"},
  };
  for (const Case& c : cases) {
    MachineFacts::Storage s = ProbeStorage(m, std::string(c.mount) + "/train");
    EXPECT_EQ(s.mount_point, c.mount);
    EXPECT_EQ(s.kind, MachineFacts::StorageKind::kLocal) << c.mount;
    EXPECT_EQ(DiskKindName(s.disk), std::string(DiskKindName(c.disk))) << c.mount;
    EXPECT_EQ(s.rotational, c.rotational) << c.mount;
    EXPECT_TRUE(s.disk_evidence.starts_with(c.evidence))
        << c.mount << ": '" << s.disk_evidence << "'";
  }
  // No block device under the root (an overlay): nothing to say.
  MachineFacts::Storage root = ProbeStorage(m, "/elsewhere");
  EXPECT_EQ(root.disk, Disk::kUnknown);
  EXPECT_EQ(root.disk_evidence, "");

  ProbeOptions o = m.Options();
  o.data_path = "/virtio/train";
  nlohmann::json j = FactsToJson(ProbeMachine(o))["storage"];
  EXPECT_EQ(j["disk"], "virtual");
  EXPECT_EQ(j["rotational"], true);  // the kernel's flag, as read
  EXPECT_EQ(j["disk_evidence"], "vda: a virtio disk");
  EXPECT_EQ(std::string(DiskKindLabel(Disk::kVirtual)), "virtual (rotational flag unreliable)");
}

TEST(ProbeTest, StorageWithoutMountTableKeepsThePath) {
  FakeMachine m;
  MachineFacts::Storage s = ProbeStorage(m, "/stoker-fixture/x");
  EXPECT_EQ(s.path, "/stoker-fixture/x");
  EXPECT_EQ(s.kind, MachineFacts::StorageKind::kUnknown);
  EXPECT_FALSE(s.fs_type);
}

// In a chroot (or a container whose mount table hides the data's mount)
// mountinfo has no entry above the path. The device then comes from stat()
// and the disk's facts from /sys/dev/block/MAJ:MIN: a real folder here, a
// fake sysfs and a mount table without it, so nothing depends on how this
// machine is mounted.
TEST(ProbeTest, StorageWithoutAMountEntryUsesTheDeviceOfThePath) {
  for (bool partition : {false, true}) {
    FakeMachine m;
    m.Write("proc/self/mountinfo", "21 26 0:20 / /proc rw,relatime - proc proc rw\n");
    const std::string data = m.root() + "/data/train";
    std::filesystem::create_directories(data);
    struct stat st;
    ASSERT_EQ(::stat(data.c_str(), &st), 0);
    const std::string device =
        std::to_string(major(st.st_dev)) + ":" + std::to_string(minor(st.st_dev));
    if (partition) {
      m.Write("sys/devices/disk/queue/rotational", "1\n");
      m.Write("sys/devices/disk/disk1/partition", "1\n");
      m.Link("sys/dev/block/" + device, "../../devices/disk/disk1");
    } else {
      m.Write("sys/devices/disk/queue/rotational", "1\n");
      m.Link("sys/dev/block/" + device, "../../devices/disk");
    }

    MachineFacts::Storage s = ProbeStorage(m, data);
    EXPECT_EQ(s.path, std::filesystem::canonical(data).string());
    EXPECT_EQ(s.device, device);
    // Devices with major 0 (tmpfs, overlay, NFS) have no block queue.
    if (major(st.st_dev) != 0) {
      EXPECT_EQ(s.rotational, true) << "partition " << partition;
    } else {
      EXPECT_FALSE(s.rotational);
    }
    // The mount point is the highest folder on the same device.
    ASSERT_TRUE(s.mount_point);
    EXPECT_TRUE(s.path == *s.mount_point || *s.mount_point == "/" ||
                s.path.starts_with(*s.mount_point + "/"))
        << *s.mount_point << " is not above " << s.path;
  }
}

TEST(ProbeTest, JsonHasTheStableKeysWithNullForUnknown) {
  FakeMachine m;
  BuildQuotaContainerV2(m);
  nlohmann::json j = FactsToJson(ProbeMachine(m.Options()));
  EXPECT_EQ(j["cpu"]["logical"], 16);
  EXPECT_EQ(j["cpu"]["physical_cores"], 8);
  EXPECT_EQ(j["cpu"]["affinity"], 16);
  EXPECT_EQ(j["cpu"]["quota_cores"], 1.5);
  EXPECT_EQ(j["cpu"]["budget_cores"], 1.5);
  EXPECT_EQ(j["memory"]["total_bytes"], 64 * kGiB);
  EXPECT_EQ(j["memory"]["available_bytes"], 60 * kGiB);
  EXPECT_EQ(j["memory"]["cgroup_limit_bytes"], 2 * kGiB);
  EXPECT_EQ(j["shm"]["size_bytes"], 64 * kMiB);
  EXPECT_EQ(j["shm"]["free_bytes"], 64 * kMiB);
  EXPECT_TRUE(j["limits"]["nproc"].is_null());
  EXPECT_TRUE(j["limits"].contains("nofile"));
  EXPECT_TRUE(j["storage"].is_null());
  EXPECT_TRUE(j["gpus"].is_array());
  EXPECT_EQ(j["ranks"]["rank"], 0);
  EXPECT_EQ(j["ranks"]["world_size"], 1);
  EXPECT_EQ(j["ranks"]["local_rank"], 0);
  EXPECT_EQ(j["ranks"]["local_world_size"], 1);

  FakeMachine empty;
  nlohmann::json e = FactsToJson(ProbeMachine(empty.Options()));
  for (const char* key : {"logical", "physical_cores", "affinity", "quota_cores", "budget_cores"}) {
    EXPECT_TRUE(e["cpu"].contains(key)) << key;
    EXPECT_TRUE(e["cpu"][key].is_null()) << key;
  }
}

TEST(ProbeTest, ADataPathThatCannotBeReadIsSaid) {
  // A FUSE store whose server is gone answers ENOTCONN; its mount still read
  // as a healthy store. A path under a file (ENOTDIR) stands in for it.
  const std::string file = ::testing::TempDir() + "/probe_not_a_folder";
  { std::ofstream(file) << "x"; }
  ProbeOptions o;
  o.data_path = file + "/train";
  MachineFacts f = ProbeMachine(o);
  std::filesystem::remove(file);
  EXPECT_TRUE(NotesMention(f, o.data_path.value() + ": Not a directory (the data cannot be read "
                                                    "there)"));
}

TEST(ProbeTest, RealMachineProbeDoesNotFail) {
  ProbeOptions o;
  o.shm_path = ::testing::TempDir();  // statvfs of a real folder
  o.data_path = ::testing::TempDir();
  MachineFacts f = ProbeMachine(o);
  // A chroot without /proc and /sys leaves the CPU count unknown (a fact it
  // cannot read is never an error); where either file exists it is read.
  if (std::filesystem::exists("/sys/devices/system/cpu/online") ||
      std::filesystem::exists("/proc/cpuinfo")) {
    EXPECT_TRUE(f.cpu.logical);
  }
  if (f.cpu.logical) {
    EXPECT_GT(*f.cpu.logical, 0);
  }
  EXPECT_GT(f.shm.size_bytes.value_or(0), 0u);
  ASSERT_TRUE(f.storage);
  // Known with or without a mount table entry (a chroot has none).
  EXPECT_TRUE(f.storage->device);
  EXPECT_TRUE(f.storage->mount_point);
  EXPECT_NO_THROW(FactsToJson(f).dump());
}

TEST(ProbeTest, FormatBytesUsesBinaryUnits) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(64 * kMiB), "64.0 MiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.5 GiB");
}

TEST(DescendantsCpuTest, CountsALiveChildsCpuAsItRuns) {
  if (!std::filesystem::exists("/proc/self/task/" + std::to_string(getpid()) + "/children")) {
    GTEST_SKIP() << "this kernel's /proc lists no children";
  }
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // burns 80 ms of CPU, says so, and waits to be killed
    timespec t{};
    do {
      clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    } while (t.tv_sec == 0 && t.tv_nsec < 80'000'000);
    (void)!write(ready[1], "x", 1);
    pause();
    _exit(0);
  }
  char c;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  const double cpu = DescendantsCpuSeconds();
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  close(ready[0]);
  close(ready[1]);
  EXPECT_GE(cpu, 0.05);                     // clock ticks round down; 80 ms were spent
  EXPECT_EQ(DescendantsCpuSeconds(), 0.0);  // collected: no longer a descendant
}

}  // namespace
}  // namespace stoker::hw
