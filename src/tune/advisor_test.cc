#include "stoker/advisor.h"

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "stoker/defaults.h"
#include "testing/fake_machine.h"

namespace stoker {
namespace {

using hw::FakeMachine;

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kGiB = size_t{1} << 30;
constexpr size_t kCrop = 3 * 224 * 224;  // the assumed sample
constexpr size_t kBatch = 64 * kCrop;    // the assumed batch, 9.19 MiB

const AdviceRule& Rule(const Advice& advice, const std::string& name) {
  for (const AdviceRule& r : advice.rules) {
    if (r.name == name) return r;
  }
  ADD_FAILURE() << "no rule named " << name;
  static const AdviceRule kNone;
  return kNone;
}

bool Has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

AdviseInputs Processes(std::optional<int64_t> batch_size = std::nullopt) {
  AdviseInputs in;
  in.workers_kind = WorkersKind::kProcesses;
  in.batch_size = batch_size;
  return in;
}

TEST(AdvisorTest, QuotaContainerLeavesOneWorkerAfterTheTrainersShare) {
  FakeMachine m;
  hw::BuildQuotaContainerV2(m);
  Advice a = Advise(ProbeMachine(m.Options()));
  // 1.5-core quota - 1 core for the trainer = 0.5 -> at least one worker.
  EXPECT_EQ(a.workers, 1);
  EXPECT_EQ(a.prefetch_batches, 2);
  EXPECT_EQ(a.batch_bytes, kBatch);
  EXPECT_EQ(a.prefetch_bytes, 2 * kBatch);
  // 80 % of (2 GiB limit - 512 MiB used), less than 80 % of 60 GiB available.
  EXPECT_EQ(a.memory_budget_bytes, static_cast<size_t>(0.8 * (1.5 * kGiB)));
  EXPECT_DOUBLE_EQ(Rule(a, "cpu budget").value.value_or(-1), 1.5);
  EXPECT_DOUBLE_EQ(Rule(a, "local ranks").value.value_or(-1), 1.5);
  const AdviceRule& trainer = Rule(a, "trainer share");
  EXPECT_EQ(trainer.value, 1);
  EXPECT_TRUE(Has(trainer.outcome, "at least one")) << trainer.outcome;
  EXPECT_TRUE(Has(Rule(a, "memory").input, "cgroup limit 2.0 GiB with 512.0 MiB used"));
  EXPECT_TRUE(Has(Rule(a, "shared memory").outcome, "not used"));
  EXPECT_TRUE(Has(a.note, "tuner refines")) << a.note;
  EXPECT_TRUE(Has(a.note, "A static guess from the machine's facts, nothing measured")) << a.note;
}

TEST(AdvisorTest, SmallShmCapsProcessWorkersBatches) {
  FakeMachine m;
  hw::BuildQuotaContainerV2(m);
  MachineFacts facts = ProbeMachine(m.Options());
  // The default batch: 80 % of 64 MiB holds 5 of them, more than the 2 wanted.
  Advice fits = Advise(facts, Processes());
  EXPECT_EQ(fits.workers, 1);
  EXPECT_EQ(fits.prefetch_batches, 2);
  EXPECT_FALSE(Rule(fits, "shared memory").limited);
  // 256 samples (36.75 MiB): only one batch fits in 80 % of 64 MiB.
  Advice capped = Advise(facts, Processes(256));
  EXPECT_EQ(capped.workers, 1);
  EXPECT_EQ(capped.prefetch_batches, 1);
  const AdviceRule& shm = Rule(capped, "shared memory");
  EXPECT_TRUE(shm.limited);
  EXPECT_TRUE(Has(shm.outcome, "--shm-size")) << shm.outcome;
  // 1024 samples (147 MiB) do not fit at all.
  Advice none = Advise(facts, Processes(1024));
  EXPECT_EQ(none.workers, 1);
  EXPECT_EQ(none.prefetch_batches, 1);
  EXPECT_TRUE(Has(Rule(none, "shared memory").outcome, "not even one batch"));
}

TEST(AdvisorTest, MemoryLimitThenShmCapProcessWorkersOnABigHost) {
  FakeMachine m;
  hw::BuildQuotaContainerV2(m);
  m.Write("sys/fs/cgroup/docker/abc123/cpu.max", "max 100000\n");
  MachineFacts facts = ProbeMachine(m.Options());
  ASSERT_DOUBLE_EQ(facts.cpu.budget_cores.value_or(-1), 16);

  Advice threads = Advise(facts);
  EXPECT_EQ(threads.workers, 15);                                // 16 cores - 1 for the trainer
  EXPECT_EQ(threads.prefetch_batches, DefaultPrefetch(15, 64));  // 5

  // Budget 80 % of 1.5 GiB = 1228.8 MiB. A 256 MiB process plus one 9.19 MiB
  // batch each: 4 workers (1060.75 MiB); with 2 batches each, 8 batches
  // (1097.5 MiB). Then 80 % of the 64 MiB shm holds 5 batches.
  Advice processes = Advise(facts, Processes());
  EXPECT_TRUE(Rule(processes, "memory").limited);
  EXPECT_EQ(Rule(processes, "memory").value, 4);
  EXPECT_TRUE(Has(Rule(processes, "memory").outcome, "4 workers, 8 batches"))
      << Rule(processes, "memory").outcome;
  EXPECT_TRUE(Rule(processes, "shared memory").limited);
  EXPECT_EQ(processes.workers, 4);
  EXPECT_EQ(processes.prefetch_batches, 5);
  EXPECT_EQ(processes.prefetch_bytes, 5 * kBatch);
}

TEST(AdvisorTest, BatchLargerThanTheMemoryBudgetSaysSo) {
  FakeMachine m;
  hw::BuildQuotaContainerV2(m);
  AdviseInputs in;
  in.batch_size = 64;
  in.sample_bytes = 32 * kMiB;  // 2 GiB a batch, over the 1.2 GiB budget
  Advice a = Advise(ProbeMachine(m.Options()), in);
  EXPECT_EQ(a.workers, 1);
  EXPECT_EQ(a.prefetch_batches, 1);
  EXPECT_TRUE(Has(Rule(a, "memory").outcome, "reduce the batch size"));
  EXPECT_FALSE(a.fits);
  // One 0.75 GiB batch fits the budget, but not the two a loader holds
  // (one delivered, one being written): it did say "1 batch", which a
  // loader then refused.
  in.sample_bytes = 12 * kMiB;
  a = Advise(ProbeMachine(m.Options()), in);
  EXPECT_FALSE(a.fits);
  in.sample_bytes = 8 * kMiB;  // 2 x 0.5 GiB and a thread worker fit
  a = Advise(ProbeMachine(m.Options()), in);
  EXPECT_TRUE(a.fits);
  EXPECT_EQ(a.prefetch_batches, 1);
}

// The facts of the machine `build` makes, with `stat` as the memory.stat
// in its cgroup folder `dir`.
MachineFacts WithMemoryStat(void (*build)(FakeMachine&), const std::string& dir,
                            const std::string& stat) {
  FakeMachine m;
  build(m);
  m.Write("sys/fs/cgroup/" + dir + "/memory.stat", stat);
  return ProbeMachine(m.Options());
}

TEST(AdvisorTest, ACgroupsFileCacheIsRoomNotUse) {
  // A job that has read its data: the cgroup's use is mostly file cache,
  // which the kernel reclaims before an allocation fails. Counted as use,
  // it left a budget of KiB and every batch was refused (torch ran).
  // 2 GiB limit, 512 MiB charged, 384 MiB of it file cache (active + inactive).
  const MachineFacts facts = WithMemoryStat(
      hw::BuildQuotaContainerV2, "docker/abc123",
      "anon 104857600\nfile 432013312\nactive_file 100663296\ninactive_file 301989888\n"
      "shmem 29360128\n");
  EXPECT_EQ(facts.memory.cgroup_cache_bytes, 384 * kMiB);
  Advice a = Advise(facts);
  EXPECT_EQ(a.memory_budget_bytes, static_cast<size_t>(0.8 * (2.0 * kGiB - 128.0 * kMiB)));
  EXPECT_TRUE(Has(Rule(a, "memory").input,
                  "cgroup limit 2.0 GiB with 128.0 MiB used (and 384.0 MiB of file cache"))
      << Rule(a, "memory").input;
  // v1 counts the hierarchy's under "total_"; a cache reading over the use
  // (1 GiB limit, 256 MiB charged) leaves no use, never a wrapped one.
  const MachineFacts v1 =
      WithMemoryStat(hw::BuildPodV1, "memory/kubepods/pod1",
                     "cache 999\nactive_file 1\ninactive_file 1\ntotal_active_file 536870912\n"
                     "total_inactive_file 0\n");
  EXPECT_EQ(v1.memory.cgroup_cache_bytes, 512 * kMiB);
  EXPECT_EQ(Advise(v1).memory_budget_bytes, static_cast<size_t>(0.8 * kGiB));
}

TEST(AdvisorTest, PodV1QuotaAndMemoryLimit) {
  FakeMachine m;
  hw::BuildPodV1(m);
  MachineFacts facts = ProbeMachine(m.Options());
  Advice a = Advise(facts);
  EXPECT_EQ(a.workers, 1);  // 2.5-core quota under a 5-CPU affinity: 1.5 left -> 1
  EXPECT_EQ(a.prefetch_batches, 2);
  EXPECT_EQ(a.memory_budget_bytes, static_cast<size_t>(0.8 * (768.0 * kMiB)));
  EXPECT_FALSE(Rule(a, "process limit").limited);  // 4096 / 2 is plenty
  // 2048 samples (294 MiB) with a 256 MiB process: 550 MiB of 614.4 MiB, so
  // one batch in flight and no spare.
  Advice big = Advise(facts, Processes(2048));
  EXPECT_EQ(big.workers, 1);
  EXPECT_EQ(big.prefetch_batches, 1);
  EXPECT_TRUE(Rule(big, "memory").limited);
  EXPECT_FALSE(Rule(big, "shared memory").limited);  // 8 GiB of shm
}

TEST(AdvisorTest, PinnedHostUsesItsAffinity) {
  FakeMachine m;
  hw::BuildPinnedHost(m);
  Advice a = Advise(ProbeMachine(m.Options()));
  EXPECT_EQ(a.workers, 3);                                // 4 CPUs - 1 for the trainer
  EXPECT_EQ(a.prefetch_batches, DefaultPrefetch(3, 64));  // 2
  EXPECT_EQ(Rule(a, "prefetch depth").value, DefaultPrefetch(3, 64));
  EXPECT_EQ(a.memory_budget_bytes, static_cast<size_t>(0.8 * (16.0 * kGiB)));
}

TEST(AdvisorTest, LocalRanksShareTheNode) {
  FakeMachine m;
  hw::BuildPinnedHost(m);
  m.Write("proc/self/status", "Cpus_allowed_list:\t0-15\n");
  m.env = {{"RANK", "1"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}};
  Advice a = Advise(ProbeMachine(m.Options()));
  // 16 CPUs / 4 ranks = 4 cores each, 1 of them for the trainer.
  EXPECT_DOUBLE_EQ(Rule(a, "local ranks").value.value_or(-1), 4.0);
  EXPECT_TRUE(Rule(a, "local ranks").limited);
  EXPECT_EQ(a.workers, 3);
}

TEST(AdvisorTest, StorageKindShapesTheWorkerCount) {
  FakeMachine m;
  hw::BuildPinnedHost(m);  // 4 CPUs: 3 workers by CPU
  MachineFacts facts = ProbeMachine(m.Options());
  using Kind = MachineFacts::StorageKind;
  using Disk = MachineFacts::DiskKind;
  auto with_storage = [&](Kind kind, Disk disk, std::optional<bool> rotational = std::nullopt) {
    MachineFacts f = facts;
    f.storage = MachineFacts::Storage{};
    f.storage->path = "/data";
    f.storage->fs_type = "fs";
    f.storage->kind = kind;
    f.storage->disk = disk;
    f.storage->rotational = rotational;
    return Advise(f);
  };
  Advice hdd = with_storage(Kind::kLocal, Disk::kHdd, true);
  EXPECT_EQ(hdd.workers, 2);
  EXPECT_EQ(hdd.prefetch_batches, DefaultPrefetch(2, 64));  // 2
  EXPECT_TRUE(Rule(hdd, "storage").limited);
  EXPECT_TRUE(Has(Rule(hdd, "storage").outcome, "HDD: more than 2 concurrent readers"));
  EXPECT_EQ(with_storage(Kind::kLocal, Disk::kSsd, false).workers, 3);
  EXPECT_EQ(with_storage(Kind::kLocal, Disk::kUnknown).workers, 3);
  EXPECT_EQ(with_storage(Kind::kMemory, Disk::kUnknown).workers, 3);
  // The rotational flag alone is no evidence of a spinning disk.
  EXPECT_EQ(with_storage(Kind::kLocal, Disk::kUnknown, true).workers, 3);
  Advice virtual_disk = with_storage(Kind::kLocal, Disk::kVirtual, true);
  EXPECT_EQ(virtual_disk.workers, 3);
  EXPECT_FALSE(Rule(virtual_disk, "storage").limited);
  EXPECT_TRUE(Has(Rule(virtual_disk, "storage").outcome, "virtual disk"));
  // Latency-bound: 4 per core of the rank's 4 cores = 16 (within 8..64).
  Advice nfs = with_storage(Kind::kNetwork, Disk::kUnknown);
  EXPECT_EQ(nfs.workers, 16);
  EXPECT_EQ(nfs.prefetch_batches, DefaultPrefetch(16, 64));  // 6
  EXPECT_TRUE(Has(Rule(nfs, "storage").outcome, "latency-bound"));
  EXPECT_EQ(with_storage(Kind::kFuse, Disk::kUnknown).workers, 16);
  EXPECT_TRUE(Has(Rule(Advise(facts), "storage").input, "no data path"));
}

// Issue 23: `stoker advise` on a VM fired the rotational-disk rule for a
// virtio disk that reported rotational=1. Probed from sysfs, only a disk
// with evidence of spinning (a hardware vendor) gets fewer readers.
TEST(AdvisorTest, TheHddRuleFiresOnlyOnEvidence) {
  FakeMachine m;
  hw::BuildPinnedHost(m);  // 4 CPUs: 3 workers by CPU
  hw::BuildDisks(m);
  auto advise_on = [&](const std::string& mount) {
    ProbeOptions o = m.Options();
    o.data_path = mount + "/train";
    return Advise(ProbeMachine(o));
  };
  for (const char* mount : {"/virtio", "/xen", "/vscsi", "/qemu", "/hyperv", "/bare", "/loop",
                            "/lvm-vm", "/ssd", "/nvme"}) {
    Advice a = advise_on(mount);
    EXPECT_EQ(a.workers, 3) << mount;
    EXPECT_FALSE(Rule(a, "storage").limited) << mount;
    EXPECT_FALSE(Rule(a, "storage").outcome.starts_with("HDD:")) << mount;
  }
  const Advice on_vm = advise_on("/virtio");
  const AdviceRule& vm = Rule(on_vm, "storage");
  EXPECT_TRUE(Has(vm.input, "disk virtual (rotational flag unreliable) (vda: a virtio disk)"))
      << vm.input;
  for (const char* mount : {"/hdd", "/lvm-hdd"}) {
    Advice a = advise_on(mount);
    EXPECT_EQ(a.workers, 2) << mount;
    EXPECT_TRUE(Rule(a, "storage").limited) << mount;
    EXPECT_TRUE(Has(Rule(a, "storage").input, "disk HDD (rotational)")) << mount;
  }
}

TEST(AdvisorTest, ProcessLimitCapsWorkers) {
  FakeMachine m;
  hw::BuildPinnedHost(m);
  m.rlimits[RLIMIT_NPROC] = 4;
  Advice a = Advise(ProbeMachine(m.Options()));
  EXPECT_EQ(a.workers, 2);  // half of 4
  EXPECT_TRUE(Rule(a, "process limit").limited);
}

TEST(AdvisorTest, OpenFileLimitCapsWorkersAndTheTuner) {
  FakeMachine m;
  hw::BuildPinnedHost(m);
  m.rlimits[RLIMIT_NOFILE] = 8;
  Advice a = Advise(ProbeMachine(m.Options()));
  EXPECT_EQ(a.max_workers, 2);  // 4 files a worker
  EXPECT_LE(a.workers, 2);
  EXPECT_TRUE(Has(Rule(a, "open files").outcome, "the tuner's cap too"))
      << Rule(a, "open files").outcome;
  m.rlimits[RLIMIT_NOFILE] = 1 << 20;
  a = Advise(ProbeMachine(m.Options()));
  EXPECT_EQ(a.max_workers, kMaxWorkers);
  EXPECT_FALSE(Rule(a, "open files").limited);
}

TEST(AdvisorTest, UnknownFactsFallBackAndSaySo) {
  for (bool garbage : {false, true}) {
    FakeMachine m;
    if (garbage) hw::BuildGarbage(m);
    Advice a = Advise(ProbeMachine(m.Options()), Processes());
    EXPECT_EQ(a.workers, 1) << garbage;
    EXPECT_EQ(a.prefetch_batches, 2) << garbage;
    EXPECT_EQ(a.memory_budget_bytes, static_cast<size_t>(0.8 * (4.0 * kGiB)));
    EXPECT_TRUE(Has(Rule(a, "cpu budget").outcome, "unknown; assuming 1 core"));
    if (garbage) {
      EXPECT_TRUE(Has(Rule(a, "local ranks").input, "assuming 1 rank"));
    }
    EXPECT_TRUE(Has(Rule(a, "memory").input, "assuming 4.0 GiB"));
    EXPECT_TRUE(Has(Rule(a, "shared memory").outcome, "not capped"));
  }
}

TEST(AdvisorTest, JsonCarriesTheAdviceAndEveryRule) {
  FakeMachine m;
  hw::BuildQuotaContainerV2(m);
  AdviseInputs in = Processes(256);
  Advice a = Advise(ProbeMachine(m.Options()), in);
  nlohmann::json j = AdviceToJson(a, in);
  EXPECT_EQ(j["workers"], 1);
  EXPECT_EQ(j["prefetch_batches"], 1);
  EXPECT_EQ(j["prefetch_bytes"], a.prefetch_bytes);
  EXPECT_EQ(j["memory_budget_bytes"], a.memory_budget_bytes);
  EXPECT_EQ(j["workers_kind"], "processes");
  ASSERT_EQ(j["rules"].size(), a.rules.size());
  for (const auto& rule : j["rules"]) {
    for (const char* key : {"name", "input", "outcome", "value", "limited"}) {
      EXPECT_TRUE(rule.contains(key)) << key;
    }
  }
  EXPECT_TRUE(j["note"].is_string());
}

TEST(AdvisorTest, TheAdvicesArgumentsSayNothingWasMeasured) {
  const LoaderArgs a = LoaderArgsFromAdvice(LoaderKind::kTorchDataLoader, 3, 7, /*gpus=*/1);
  EXPECT_EQ(a.Line(),
            "DataLoader(num_workers=3, prefetch_factor=3, pin_memory=True, "
            "persistent_workers=True)");  // 7 batches over 3 workers, rounded up
  EXPECT_EQ(a.rules.size(), 4u);
  EXPECT_FALSE(a.measured);
  EXPECT_TRUE(a.Text().starts_with(
      "For torch.utils.data.DataLoader (not measured, a static guess from the advisor's rules "
      "on this machine's facts), paste:\n  DataLoader(num_workers=3, "))
      << a.Text();
  EXPECT_TRUE(Has(a.note, "stoker.bench(dataset) measures torch.utils.data.DataLoader"));
  const LoaderArgs none = LoaderArgsFromAdvice(LoaderKind::kTorchDataLoader, 0, 2, 0);
  EXPECT_EQ(none.Line(), "DataLoader(num_workers=0, pin_memory=False, persistent_workers=False)");
  const auto j = LoaderArgsToJson(none);
  EXPECT_EQ(j["loader"], "torch.utils.data.DataLoader");
  EXPECT_EQ(j["measured"], false);
  EXPECT_TRUE(j["prefetch_factor"].is_null());
  EXPECT_FALSE(j["persistent_workers"].get<bool>());
  for (const char* key : {"basis", "line", "rules", "note", "num_workers", "pin_memory"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

// Issue 23: `stoker bench` pasted a torch DataLoader line measured on
// stoker's native pipeline. A sweep answers for the loader it measured, and
// names it and the data.
TEST(AdvisorTest, ASweepAnswersForTheLoaderItMeasuredOnly) {
  // Best at 6 workers, which ran with DefaultPrefetch(6, 64) = 3 batches in flight.
  const SweepSubject native{LoaderKind::kNative, "images in /data (2000), train 224", 64};
  const LoaderArgs a = LoaderArgsFromSweep(native, 6, 812.5, 0.004, DefaultPrefetch(6, 64), 0);
  EXPECT_TRUE(a.measured);
  EXPECT_EQ(a.Line(), "stoker.Loader(workers=6, pin_memory=False)");
  EXPECT_EQ(a.basis,
            "measured on stoker's native pipeline (C++ worker threads) over images in /data "
            "(2000), train 224, batch 64, by this sweep");
  ASSERT_EQ(a.rules.size(), 4u);
  EXPECT_EQ(a.rules[0],
            "workers=6: the sweep's best count (812.5 samples/s, stall 0.4 %, 3 batches in "
            "flight), measured with stoker.Loader; the fewest workers within 3 % of the highest "
            "samples/s (RecommendedSweepPoint)");
  EXPECT_EQ(a.rules[3], "in the CLI: stoker run --workers 6");
  EXPECT_TRUE(a.Text().starts_with("For stoker.Loader (measured on stoker's native pipeline"));
  EXPECT_FALSE(Has(a.Text(), "DataLoader(num_workers")) << a.Text();
  EXPECT_TRUE(Has(a.note, "Not a count for a DataLoader over your own Dataset")) << a.note;
  const auto j = LoaderArgsToJson(a);
  EXPECT_EQ(j["loader"], "stoker.Loader");
  EXPECT_TRUE(j["prefetch_factor"].is_null());
  EXPECT_TRUE(j["persistent_workers"].is_null());

  const SweepSubject torch{LoaderKind::kTorchDataLoader, "Squares (48 samples)", 4};
  const LoaderArgs t = LoaderArgsFromSweep(torch, 2, 90, 0.5, 4, 0);
  EXPECT_EQ(t.Line(),
            "DataLoader(num_workers=2, prefetch_factor=2, pin_memory=False, "
            "persistent_workers=True)");
  EXPECT_TRUE(
      t.Text().starts_with("For torch.utils.data.DataLoader (measured on Squares (48 "
                           "samples), batch 4, by this sweep), paste:\n"))
      << t.Text();
  EXPECT_EQ(
      t.rules[0],
      "num_workers=2: the sweep's best count (90.0 samples/s, stall 50.0 %, 4 batches in "
      "flight), measured with torch.utils.data.DataLoader; the fewest workers within 3 % of the "
      "highest samples/s (RecommendedSweepPoint)");

  const SweepSubject stoker_dl{LoaderKind::kStokerDataLoader, "Squares (48 samples)", 4};
  const LoaderArgs sd = LoaderArgsFromSweep(stoker_dl, 3, 120, 0.1, DefaultPrefetch(3, 1), 0);
  EXPECT_EQ(sd.Line(), "stoker.DataLoader(num_workers=3, pin_memory=False)");
  EXPECT_TRUE(sd.Text().starts_with("For stoker.DataLoader (measured on Squares"));
  EXPECT_TRUE(Has(sd.note, "num_workers=\"auto\"")) << sd.note;

  // Best without workers: no prefetch_factor (torch refuses it at 0).
  const LoaderArgs none = LoaderArgsFromSweep(torch, 0, 90, 0.5, DefaultPrefetch(0, 64), 0);
  EXPECT_EQ(none.Line(), "DataLoader(num_workers=0, pin_memory=False, persistent_workers=False)");
  EXPECT_EQ(none.rules[0],
            "num_workers=0: the sweep's best count (90.0 samples/s, stall 50.0 %), measured "
            "with torch.utils.data.DataLoader; the fewest workers within 3 % of the highest "
            "samples/s (RecommendedSweepPoint)");
}

}  // namespace
}  // namespace stoker
