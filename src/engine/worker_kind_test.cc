// The engine with a WorkerKind: items (whole user batches) made by a kind's
// workers, under the engine's own plan, policy, checkpoints and accounting.

#include "stoker/worker_kind.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <numeric>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/thread_annotations.h"
#include "stoker/loader.h"
#include "testing/loader_harness.h"
#include "testing/untuned_loader.h"

namespace stoker {
namespace {

using testing::MakeUntunedLoader;

// A kind's own word on a failed sample, which the engine carries unread.
struct SampleMark : StatusDetail {
  explicit SampleMark(int64_t index) : index(index) {}
  int64_t index;
};

// Item i holds user samples i*kPer .. i*kPer+kPer-1, of which those in
// `bad` fail (named by their index, marked with a SampleMark) and the item
// keeps the rest. Its output is (item, samples kept). Counts workers made
// and outputs recycled.
class FakeKind : public WorkerKind {
 public:
  static constexpr int64_t kPer = 4;
  FakeKind(int64_t items, std::set<int64_t> bad, std::set<int64_t> bad_items = {})
      : items_(items), bad_(std::move(bad)), bad_items_(std::move(bad_items)) {}

  SampleSpec spec() const override { return {{2}, DType::kInt64}; }
  int64_t items() const override { return items_; }
  std::string Key(int64_t item) const override {
    if (key_out_of_memory.load() && bad_items_.count(item) != 0) throw std::bad_alloc();
    return "item " + std::to_string(item);
  }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap&) const override {
    workers_made.fetch_add(1);
    if (place == WorkerPlace::kConsumer) consumer_workers.fetch_add(1);
    return std::make_unique<Worker>(*this);
  }
  bool recycles() const override { return true; }
  void Recycle(std::span<std::byte> out) const override {
    int64_t words[2];
    std::memcpy(words, out.data(), sizeof words);
    if (words[1] != 0) recycled.fetch_add(1);  // written outputs only
  }

  // Remote slots: what the kind offers and was last told, and items marked
  // as made remotely (odd items, as if a remote slot made them).
  int remote_capacity() const override { return remote_offered.load(); }
  void Resized(int workers, int remote) const override {
    last_workers.store(workers);
    last_remote.store(remote);
    if (remote > workers) split_wrong.store(true);
  }
  std::atomic<int> remote_offered{0};
  std::atomic<bool> mark_remote{false};
  std::atomic<bool> name_failures{false};           // named "part <sample>" (SampleFailure::name)
  std::atomic<bool> key_out_of_memory{false};       // naming a bad item runs out of memory
  mutable std::atomic<int64_t> interrupt_item{-1};  // says this item was interrupted, once
  mutable std::atomic<int> last_workers{-1}, last_remote{-1};
  mutable std::atomic<bool> split_wrong{false};

  mutable std::atomic<int> workers_made{0};
  mutable std::atomic<int> consumer_workers{0};
  mutable std::atomic<int> recycled{0};
  mutable std::atomic<int> made{0};    // outputs written
  std::atomic<int64_t> grow_bytes{0};  // each item adds this to its worker's trimmable memory

 private:
  class Worker : public KindWorker {
   public:
    explicit Worker(const FakeKind& kind) : kind_(kind) {}
    Status Run(int64_t /*epoch*/, int64_t item, std::span<std::byte> out,
               ItemOutcome* outcome) override {
      if (kind_.bad_items_.count(item) != 0) return Internal("collate_fn raised");
      if (int64_t at = item; kind_.interrupt_item.compare_exchange_strong(at, -1)) {
        outcome->interrupted = true;  // once: Ctrl-C in the user's code
        return Status::Ok();
      }
      int64_t kept = 0;
      for (int64_t s = item * kPer; s < (item + 1) * kPer; ++s) {
        if (kind_.bad_.count(s) == 0) {
          ++kept;
          continue;
        }
        outcome->failures.push_back(
            {s, "", DataError("ValueError: bad sample").WithDetail(std::make_shared<SampleMark>(s)),
             kind_.name_failures.load() ? "part " + std::to_string(s) : ""});
      }
      const int64_t words[2] = {item, kept + 1};  // +1: never zero once written
      std::memcpy(out.data(), words, sizeof words);
      kind_.made.fetch_add(1);
      outcome->label = item;
      outcome->samples = kept;
      outcome->remote = kind_.mark_remote.load() && item % 2 == 1;
      grown_ += static_cast<size_t>(kind_.grow_bytes.load());
      cpu_ns_ += 1'000'000;
      return Status::Ok();
    }
    WorkerCost cost() const override {
      return {.cpu_ns = cpu_ns_, .bytes = grown_, .trimmable_bytes = grown_};
    }

   private:
    const FakeKind& kind_;
    size_t grown_ = 0;
    int64_t cpu_ns_ = 0;
  };

  const int64_t items_;
  const std::set<int64_t> bad_, bad_items_;
};

LoaderOptions KindOptions(std::shared_ptr<const WorkerKind> kind, int workers) {
  LoaderOptions o;
  o.kind = std::move(kind);
  o.batch_size = 1;
  o.shuffle = false;
  o.workers = workers;
  return o;
}

struct Drained {
  std::vector<int64_t> items;  // delivered, in order
  int64_t samples = 0;         // user samples they hold
  std::vector<Status> errors;
};

Drained DrainEpoch(Loader& loader) {
  Drained d;
  while (true) {
    auto r = loader.Next();
    if (!r.ok()) {
      d.errors.push_back(r.status());
      if (d.errors.size() > 100) break;
      continue;
    }
    if (!r->has_value()) break;
    int64_t words[2];
    std::memcpy(words, (*r)->data().data(), sizeof words);
    d.items.push_back(words[0]);
    d.samples += words[1] - 1;
  }
  return d;
}

// A kind whose count changes between epochs (a data set that grows or
// shrinks): each epoch has the count SetEpoch gave it, whatever the workers
// made ahead from the old one; a checkpoint carries its epoch's count.
TEST(WorkerKindTest, TheItemCountMayChangeFromEpochToEpoch) {
  for (int workers : {0, 2}) {
    auto kind = std::make_shared<FakeKind>(10, std::set<int64_t>{});
    auto loader = MakeUntunedLoader(KindOptions(kind, workers));
    ASSERT_NE(loader, nullptr);
    EXPECT_EQ(DrainEpoch(*loader).items.size(), 10u);
    for (int64_t items : {13, 13, 4, 0, 7}) {
      ASSERT_TRUE(loader->SetEpoch(loader->epoch(), items, /*keep_ahead=*/true).ok());
      EXPECT_EQ(loader->batches_per_epoch(), items);
      const Drained d = DrainEpoch(*loader);
      ASSERT_EQ(static_cast<int64_t>(d.items.size()), items) << workers;
      for (int64_t i = 0; i < items; ++i) EXPECT_EQ(d.items[static_cast<size_t>(i)], i);
    }
    ASSERT_TRUE(loader->SetEpoch(loader->epoch(), 9, /*keep_ahead=*/false).ok());
    ASSERT_TRUE(loader->Next().ok());
    const LoaderState state = *loader->State();
    EXPECT_EQ(state.num_samples, 9);
    EXPECT_EQ(state.position, 1);
    auto other = MakeUntunedLoader(KindOptions(kind, workers));  // made for 10
    ASSERT_TRUE(other->Restore(state).ok());
    EXPECT_EQ(DrainEpoch(*other).items.size(), 8u);
    EXPECT_EQ(other->SetEpoch(0, -1, true).code(), StatusCode::kInvalidArgument);
  }
}

TEST(WorkerKindTest, EveryItemOnceInOrderAtAnyWorkerCount) {
  for (int workers : {0, 1, 3}) {
    auto kind = std::make_shared<FakeKind>(25, std::set<int64_t>{});
    auto loader = MakeUntunedLoader(KindOptions(kind, workers));
    ASSERT_NE(loader, nullptr);
    EXPECT_EQ(loader->batches_per_epoch(), 25);
    const Drained d = DrainEpoch(*loader);
    ASSERT_EQ(d.items.size(), 25u) << workers;
    for (int64_t i = 0; i < 25; ++i) EXPECT_EQ(d.items[static_cast<size_t>(i)], i);
    EXPECT_TRUE(d.errors.empty());
    // The engine's samples are the items (the tuner's unit); the user's
    // samples they hold are counted apart.
    EXPECT_EQ(loader->Metrics().samples_delivered, 25);
    EXPECT_EQ(loader->Metrics().user_samples_delivered, 25 * FakeKind::kPer);
    EXPECT_EQ(kind->consumer_workers.load(), 1);  // Next()'s own, made with the loader
  }
}

TEST(WorkerKindTest, EveryItemOnceWhileWorkersAndRemoteSlotsComeAndGo) {
  auto kind = std::make_shared<FakeKind>(60, std::set<int64_t>{});
  kind->remote_offered = 4;
  kind->mark_remote = true;
  auto loader = MakeUntunedLoader(KindOptions(kind, 1));
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(loader->Metrics().remote_capacity, 4);
  uint64_t state = 12345;
  auto next = [&](int n) {  // a fixed pseudo-random schedule
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<int>((state >> 33) % static_cast<uint64_t>(n));
  };
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> items;
    while (true) {
      if (next(3) == 0) ASSERT_TRUE(loader->Resize(1 + next(3)).ok());
      if (next(3) == 0) ASSERT_TRUE(loader->SetRemote(next(5)).ok());
      auto r = loader->Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      int64_t words[2];
      std::memcpy(words, (*r)->data().data(), sizeof words);
      items.push_back(words[0]);
    }
    ASSERT_EQ(items.size(), 60u) << "epoch " << epoch;
    for (int64_t i = 0; i < 60; ++i) EXPECT_EQ(items[static_cast<size_t>(i)], i);
  }
  // The kind always learned a split it can keep, and the engine counts the
  // remote items apart from its local workers' (the tuner's local figures).
  EXPECT_FALSE(kind->split_wrong.load());
  ASSERT_TRUE(loader->SetRemote(2).ok());
  ASSERT_TRUE(loader->Resize(1).ok());
  EXPECT_EQ(loader->remote(), 2);
  EXPECT_EQ(loader->workers(), 1);
  EXPECT_EQ(kind->last_workers.load(), 3);
  EXPECT_EQ(kind->last_remote.load(), 2);
  const LoaderMetrics m = loader->Metrics();
  EXPECT_EQ(m.workers_remote, 2);
  EXPECT_EQ(m.workers_target, 1);
  // Each epoch's odd items were made "remotely" (workers may be ahead into
  // the next epoch: at least).
  EXPECT_GE(m.remote_samples_produced, 3 * 30);
  EXPECT_GE(m.samples_produced, 3 * 30);
  EXPECT_GT(m.remote_busy_ns, 0);
}

TEST(WorkerKindTest, RaiseNamesTheFailedSamplesOfAnItemThenDeliversIt) {
  auto kind = std::make_shared<FakeKind>(10, std::set<int64_t>{9, 10});  // both in item 2
  auto loader = MakeUntunedLoader(KindOptions(kind, 2));
  const Drained d = DrainEpoch(*loader);
  ASSERT_EQ(d.errors.size(), 1u);
  const std::string& m = d.errors[0].message();
  EXPECT_EQ(d.errors[0].code(), StatusCode::kDataError);
  EXPECT_NE(m.find("batch 2 of epoch 0"), std::string::npos) << m;
  EXPECT_NE(m.find("2 samples failed: data error: sample 9: ValueError: bad sample; data error: "
                   "sample 10: ValueError: bad sample"),
            std::string::npos)
      << m;
  // The first failure's detail comes with the error, for the kind's own reader.
  const auto* mark = dynamic_cast<const SampleMark*>(d.errors[0].detail().get());
  ASSERT_NE(mark, nullptr);
  EXPECT_EQ(mark->index, 9);
  EXPECT_EQ(d.items.size(), 10u);  // item 2 came after its error, with its good samples
  EXPECT_EQ(d.samples, 10 * FakeKind::kPer - 2);
}

TEST(WorkerKindTest, SkipRecordsTheFailedSamplesAndKeepsTheItem) {
  auto kind = std::make_shared<FakeKind>(10, std::set<int64_t>{5});
  auto o = KindOptions(kind, 2);
  o.on_error = ErrorPolicy::kSkip;
  auto loader = MakeUntunedLoader(o);
  const Drained d = DrainEpoch(*loader);
  EXPECT_TRUE(d.errors.empty());
  EXPECT_EQ(d.items.size(), 10u);
  const auto skipped = loader->Skipped();
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].index, 5);
  EXPECT_EQ(skipped[0].reason, "data error: ValueError: bad sample");
}

// A stream's shard is known by name, not as sample or batch N of the epoch.
TEST(WorkerKindTest, AFailureTheKindNamesIsNamedSoAloneAndSkippedAsASample) {
  auto kind = std::make_shared<FakeKind>(10, std::set<int64_t>{9});
  kind->name_failures = true;
  auto loader = MakeUntunedLoader(KindOptions(kind, 2));
  const Drained d = DrainEpoch(*loader);
  ASSERT_EQ(d.errors.size(), 1u);
  EXPECT_EQ(d.errors[0].message(), "epoch 0: part 9: ValueError: bad sample");
  EXPECT_EQ(d.items.size(), 10u);

  auto o = KindOptions(kind, 2);
  o.on_error = ErrorPolicy::kSkip;
  loader = MakeUntunedLoader(o);
  EXPECT_TRUE(DrainEpoch(*loader).errors.empty());
  const auto skipped = loader->Skipped();
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].index, 9);
}

TEST(WorkerKindTest, AnItemInterruptedOnTheConsumersThreadIsMadeAgainByTheNextCall) {
  auto kind = std::make_shared<FakeKind>(6, std::set<int64_t>{});
  kind->interrupt_item = 3;
  auto loader = MakeUntunedLoader(KindOptions(kind, 0));
  const Drained d = DrainEpoch(*loader);
  ASSERT_EQ(d.errors.size(), 1u);
  EXPECT_EQ(d.errors[0].code(), StatusCode::kCancelled);
  EXPECT_EQ(d.errors[0].message(), "interrupted");
  EXPECT_EQ(d.items, (std::vector<int64_t>{0, 1, 2, 3, 4, 5}));  // none lost, none twice
}

TEST(WorkerKindTest, AnItemThatFailsWholeIsNamedByItsKey) {
  auto kind = std::make_shared<FakeKind>(6, std::set<int64_t>{}, std::set<int64_t>{3});
  auto loader = MakeUntunedLoader(KindOptions(kind, 2));
  const Drained d = DrainEpoch(*loader);
  ASSERT_EQ(d.errors.size(), 1u);
  // The item is no sample: its error is named by the kind's key alone.
  EXPECT_EQ(d.errors[0].message(), "batch 3 of epoch 0: item 3: collate_fn raised");
  EXPECT_EQ(d.items, (std::vector<int64_t>{0, 1, 2, 4, 5}));
}

TEST(WorkerKindTest, MemoryRefusedOnAWorkerThreadOutsideRunStopsTheLoaderWithAnError) {
  // Naming a failed item allocates outside the kind's Run: under an address
  // space limit (ulimit -v) that threw past the thread and aborted.
  auto kind = std::make_shared<FakeKind>(6, std::set<int64_t>{}, std::set<int64_t>{3});
  kind->key_out_of_memory = true;
  auto loader = MakeUntunedLoader(KindOptions(kind, 2));
  Status last;
  for (int i = 0; i < 7 && last.ok(); ++i) last = loader->Next().status();
  EXPECT_EQ(last.code(), StatusCode::kUnavailable);
  EXPECT_NE(last.message().find("out of memory on a worker thread"), std::string::npos)
      << last.message();
}

TEST(WorkerKindTest, AnEpochWhoseEverySampleWasSkippedIsAnError) {
  std::set<int64_t> all;
  for (int64_t s = 0; s < 3 * FakeKind::kPer; ++s) all.insert(s);
  auto o = KindOptions(std::make_shared<FakeKind>(3, all), 1);
  o.on_error = ErrorPolicy::kSkip;
  auto loader = MakeUntunedLoader(o);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(loader->Next().ok());  // the items, empty
  auto r = loader->Next();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            "epoch 0 delivered nothing: 12 samples were skipped (first: sample 0: data error: "
            "ValueError: bad sample)");
}

TEST(WorkerKindTest, ResumesFromACheckpointWithAnotherWorkerCount) {
  auto kind = std::make_shared<FakeKind>(20, std::set<int64_t>{});
  auto first = MakeUntunedLoader(KindOptions(kind, 3));
  for (int i = 0; i < 7; ++i) ASSERT_TRUE(first->Next().ok());
  const LoaderState state = *first->State();
  for (int workers : {0, 1, 4}) {
    auto second = MakeUntunedLoader(KindOptions(kind, workers));
    ASSERT_TRUE(second->Restore(state).ok());
    const Drained d = DrainEpoch(*second);
    ASSERT_EQ(d.items.size(), 13u) << workers;
    EXPECT_EQ(d.items.front(), 7);
    EXPECT_EQ(d.items.back(), 19);
  }
}

TEST(WorkerKindTest, CostElsewhereCountsAsTheWorkersAndEveryOutputIsRecycled) {
  auto kind = std::make_shared<FakeKind>(12, std::set<int64_t>{});
  {
    auto loader = MakeUntunedLoader(KindOptions(kind, 2));
    DrainEpoch(*loader);
    // 1 ms of CPU elsewhere per item, far more than the engine threads spend.
    EXPECT_GE(loader->Metrics().cpu_elsewhere_ns, 12 * 1'000'000);
  }
  // Delivered, released, handed back; one a worker made ahead for the next
  // epoch goes back when the loader does.
  EXPECT_GE(kind->made.load(), 12);
  EXPECT_EQ(kind->recycled.load(), kind->made.load());
}

TEST(WorkerKindTest, OutputsMadeAheadAndNeverDeliveredAreRecycledWhenTheLoaderGoes) {
  // A worker process's segment stays leased until its output is recycled: a
  // loader closed with batches made ahead (this epoch's and the next's)
  // must hand them back, not drop them.
  auto kind = std::make_shared<FakeKind>(12, std::set<int64_t>{});
  {
    auto o = KindOptions(kind, 2);
    o.prefetch_batches = 4;
    auto loader = MakeUntunedLoader(o);
    {
      auto first = loader->Next();
      ASSERT_TRUE(first.ok() && first->has_value());
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (kind->made.load() < 5 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_GE(kind->made.load(), 5);  // the prefetch bound's batches, made ahead
  }
  EXPECT_EQ(kind->recycled.load(), kind->made.load());
}

TEST(WorkerKindTest, AWorkerGrownPastTheCapIsReplacedBetweenItems) {
  auto kind = std::make_shared<FakeKind>(8, std::set<int64_t>{});
  kind->grow_bytes = 1 << 20;  // each item grows its worker by 1 MiB
  auto o = KindOptions(kind, 1);
  o.tuner.memory_budget_bytes = 4 << 20;  // a per-sample cap under 4 MiB
  auto loader = MakeUntunedLoader(o);
  const Drained d = DrainEpoch(*loader);
  EXPECT_EQ(d.items.size(), 8u);
  // The consumer's and the thread's, and at least one fresh one after ~4 MiB.
  EXPECT_GE(kind->workers_made.load(), 3);
}

// FakeKind whose workers start (Ready: a worker process) only once `open`.
class GatedKind : public FakeKind {
 public:
  explicit GatedKind(int64_t items) : FakeKind(items, {}) {}
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place, const SampleCap& cap) const override {
    return std::make_unique<Gate>(FakeKind::NewWorker(place, cap), open);
  }
  mutable std::atomic<bool> open{false};

 private:
  class Gate : public KindWorker {
   public:
    Gate(std::unique_ptr<KindWorker> inner, const std::atomic<bool>& open)
        : inner_(std::move(inner)), open_(open) {}
    Status Ready() override {
      while (!open_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return inner_->Ready();
    }
    Status Run(int64_t epoch, int64_t item, std::span<std::byte> out,
               ItemOutcome* outcome) override {
      return inner_->Run(epoch, item, out, outcome);
    }
    WorkerCost cost() const override { return inner_->cost(); }

   private:
    std::unique_ptr<KindWorker> inner_;
    const std::atomic<bool>& open_;
  };
};

// Workers still starting are running threads, counted as starting, not
// yet listed: the tuner reads no window of a pool that is not yet up.
TEST(WorkerKindTest, WorkersStillStartingRunButAreNotYetListed) {
  auto kind = std::make_shared<GatedKind>(10);
  auto loader = MakeUntunedLoader(KindOptions(kind, 3));
  LoaderMetrics m = loader->Metrics();
  EXPECT_EQ(m.workers_running, 3);
  EXPECT_EQ(m.workers_starting, 3);
  EXPECT_TRUE(m.workers.empty());
  kind->open = true;
  EXPECT_EQ(DrainEpoch(*loader).items.size(), 10u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((m = loader->Metrics()).workers.size() < 3 &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(m.workers_running, 3);
  EXPECT_EQ(m.workers_starting, 0);
  EXPECT_EQ(m.workers.size(), 3u);
}

// Each item is one sample (its output: the item), made by workers that want
// their tasks named first; item `bad` fails as a sample does.
class ExpectingKind : public WorkerKind {
 public:
  ExpectingKind(int64_t items, int64_t bad) : items_(items), bad_(bad) {}
  SampleSpec spec() const override { return {{1}, DType::kInt64}; }
  int64_t items() const override { return items_; }
  std::string Key(int64_t item) const override { return "file" + std::to_string(item); }
  bool items_are_samples() const override { return true; }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace, const SampleCap&) const override {
    return std::make_unique<Worker>(*this);
  }
  mutable Mutex mu;
  mutable std::vector<int64_t> expected GUARDED_BY(mu);  // every item named, over all workers
  mutable std::atomic<bool> unexpected_run{false};       // a Run not in its worker's list

 private:
  class Worker : public KindWorker {
   public:
    explicit Worker(const ExpectingKind& kind) : kind_(kind) {}
    bool expects() const override { return true; }
    void Expect(int64_t, std::span<const int64_t> items) override {
      next_.assign(items.begin(), items.end());
      MutexLock lock(kind_.mu);
      kind_.expected.insert(kind_.expected.end(), items.begin(), items.end());
    }
    Status Run(int64_t, int64_t item, std::span<std::byte> out, ItemOutcome* outcome) override {
      if (next_.empty() || next_.front() != item) kind_.unexpected_run.store(true);
      if (!next_.empty()) next_.erase(next_.begin());
      if (item == kind_.bad_) return DataError("not an image");
      std::memcpy(out.data(), &item, sizeof item);
      outcome->label = item;
      return Status::Ok();
    }

   private:
    const ExpectingKind& kind_;
    std::vector<int64_t> next_;
  };
  const int64_t items_, bad_;
};

TEST(WorkerKindTest, AWorkerThatExpectsIsToldEachTaskWholeAndRunsItAlone) {
  for (int workers : {0, 1, 3}) {
    auto kind = std::make_shared<ExpectingKind>(41, 7);
    LoaderOptions o = KindOptions(kind, workers);
    o.batch_size = 4;
    o.on_error = ErrorPolicy::kSkip;
    auto loader = MakeUntunedLoader(o);
    ASSERT_NE(loader, nullptr);
    std::vector<int64_t> got;
    while (true) {
      auto r = loader->Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      for (int64_t label : (*r)->labels()) got.push_back(label);
    }
    std::vector<int64_t> want;
    for (int64_t i = 0; i < 41; ++i) {
      if (i != 7) want.push_back(i);
    }
    EXPECT_EQ(got, want) << workers;
    // Each worker ran what it was told, in order: no other worker took any.
    EXPECT_FALSE(kind->unexpected_run.load()) << workers;
    {
      MutexLock lock(kind->mu);
      // Every item was named (twice where a first start's epoch was abandoned).
      const std::set<int64_t> named(kind->expected.begin(), kind->expected.end());
      EXPECT_EQ(named.size(), 41u) << workers;
    }
    // Its items are samples: the failed one is skipped by its index and key.
    const auto skipped = loader->Skipped();
    ASSERT_EQ(skipped.size(), 1u);
    EXPECT_EQ(skipped[0].index, 7);
    EXPECT_EQ(skipped[0].key, "file7");
  }
}

// Counts a worker inside a kind's Run while it lives.
class InRun {
 public:
  explicit InRun(std::atomic<int>& running) : running_(running) { running_.fetch_add(1); }
  ~InRun() { running_.fetch_sub(1); }
  InRun(const InRun&) = delete;
  InRun& operator=(const InRun&) = delete;

 private:
  std::atomic<int>& running_;
};

// Item `item` made whole: its output (item, 1), labelled by it.
Status Made(int64_t item, std::span<std::byte> out, ItemOutcome* outcome) {
  const int64_t words[2] = {item, 1};
  std::memcpy(out.data(), words, sizeof words);
  outcome->label = item;
  return Status::Ok();
}

// Item i is made in kSteps steps; at each step but the last its worker asks
// whether it may leave the pool and, if so, yields the item, which the next
// worker continues from that step. Counts steps made and items continued.
class YieldingKind : public WorkerKind {
 public:
  static constexpr int64_t kSteps = 6;
  explicit YieldingKind(int64_t items) : items_(items) {}
  SampleSpec spec() const override { return {{2}, DType::kInt64}; }
  int64_t items() const override { return items_; }
  std::string Key(int64_t item) const override { return "item " + std::to_string(item); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace, const SampleCap&) const override {
    return std::make_unique<Worker>(*this);
  }

  mutable Mutex mu;
  // (epoch, item) -> steps made, while yielded
  mutable std::map<std::pair<int64_t, int64_t>, int64_t> progress GUARDED_BY(mu);
  mutable std::atomic<int64_t> steps{0}, yields{0};  // of epoch 0
  mutable std::atomic<int> running{0};               // workers inside Run now

 private:
  class Worker : public KindWorker {
   public:
    explicit Worker(const YieldingKind& kind) : kind_(kind) {}
    Status Run(int64_t epoch, int64_t item, std::span<std::byte> out,
               ItemOutcome* outcome) override {
      const InRun in_run(kind_.running);
      int64_t step = 0;
      {
        MutexLock lock(kind_.mu);
        if (auto it = kind_.progress.find({epoch, item}); it != kind_.progress.end()) {
          step = it->second;
          kind_.progress.erase(it);
        }
      }
      for (; step < kSteps; ++step) {
        std::this_thread::sleep_for(std::chrono::microseconds(300));
        if (epoch == 0) kind_.steps.fetch_add(1);
        if (step + 1 < kSteps && outcome->may_leave != nullptr && (*outcome->may_leave)()) {
          MutexLock lock(kind_.mu);
          kind_.progress[{epoch, item}] = step + 1;
          if (epoch == 0) kind_.yields.fetch_add(1);
          outcome->yielded = true;
          return Status::Ok();
        }
      }
      return Made(item, out, outcome);
    }

   private:
    const YieldingKind& kind_;
  };
  const int64_t items_;
};

// A worker that leaves mid-item hands it over: the pool shrinks at once, and
// another worker continues the item where it stopped. Every item comes once,
// in order, and no step is made twice.
TEST(WorkerKindTest, AnItemYieldedByALeavingWorkerIsContinuedByAnother) {
  auto kind = std::make_shared<YieldingKind>(200);
  auto loader = MakeUntunedLoader(KindOptions(kind, 4));
  ASSERT_NE(loader, nullptr);
  std::vector<int64_t> got;
  bool shrink = false;  // due, and not yet made
  for (int n = 0;; ++n) {
    if (n % 20 == 5) {
      shrink = n % 40 == 5;
      if (!shrink) ASSERT_TRUE(loader->Resize(4).ok());
    }
    // Down only while two workers are mid-item: with the prefetch window
    // full (a loaded machine runs the consumer late) all four may be idle,
    // and idle workers leave first, yielding nothing. Each batch taken lets
    // one start again.
    if (shrink && kind->running.load() >= 2) {
      ASSERT_TRUE(loader->Resize(1).ok());
      shrink = false;
    }
    auto r = loader->Next();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    if (!r->has_value()) break;
    got.push_back((*r)->labels()[0]);
  }
  std::vector<int64_t> want(200);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(got, want);
  EXPECT_GT(kind->yields.load(), 0);
  EXPECT_EQ(kind->steps.load(), 200 * YieldingKind::kSteps);  // none made twice
}

// Four items an epoch. Items of epoch 1 wait until the consumer starts that
// epoch, as a kind's batch list (given at iter()) makes them wait. In epoch
// 0, the worker of item 3 commits to leave once the pool shrinks, waits a
// while for another worker to start an item of epoch 1, then yields item 3;
// item 2 ends once item 3's worker has committed.
class HandOverKind : public WorkerKind {
 public:
  SampleSpec spec() const override { return {{2}, DType::kInt64}; }
  int64_t items() const override { return 4; }
  std::string Key(int64_t item) const override { return "item " + std::to_string(item); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace, const SampleCap&) const override {
    return std::make_unique<Worker>(*this);
  }

  void StartEpoch(int64_t epoch) const {
    MutexLock lock(mu);
    started = epoch;
    cv.NotifyAll();
  }
  void Shrunk() const {
    MutexLock lock(mu);
    shrunk = true;
    cv.NotifyAll();
  }

  mutable Mutex mu;
  mutable CondVar cv;
  mutable int64_t started GUARDED_BY(mu) = 0;  // the epoch the consumer is in
  mutable bool shrunk GUARDED_BY(mu) = false;
  mutable bool committed GUARDED_BY(mu) = false;    // item 3's worker may leave
  mutable bool ahead_began GUARDED_BY(mu) = false;  // an item of epoch 1 started
  mutable bool yielded GUARDED_BY(mu) = false;
  mutable std::atomic<int> running{0};  // workers inside Run now

 private:
  class Worker : public KindWorker {
   public:
    explicit Worker(const HandOverKind& kind) : kind_(kind) {}
    Status Run(int64_t epoch, int64_t item, std::span<std::byte> out,
               ItemOutcome* outcome) override {
      const InRun in_run(kind_.running);
      const auto waited = [&](auto ready, std::chrono::milliseconds limit) REQUIRES(kind_.mu) {
        const auto until = std::chrono::steady_clock::now() + limit;
        while (!ready() && std::chrono::steady_clock::now() < until) {
          kind_.cv.WaitUntil(kind_.mu, until);
        }
        return ready();
      };
      {
        MutexLock lock(kind_.mu);
        if (epoch > 0) {
          kind_.ahead_began = true;
          kind_.cv.NotifyAll();
          if (!waited([&]() REQUIRES(kind_.mu) { return kind_.started >= epoch; },
                      std::chrono::seconds(10))) {
            return Internal("epoch " + std::to_string(epoch) + " never started");
          }
        } else if (item == 2) {
          waited([&]() REQUIRES(kind_.mu) { return kind_.committed; }, std::chrono::seconds(10));
        } else if (item == 3 && !kind_.yielded) {
          waited([&]() REQUIRES(kind_.mu) { return kind_.shrunk; }, std::chrono::seconds(10));
          bool leaves = false;
          for (int tries = 0; !leaves && tries < 1000; ++tries) {
            leaves = outcome->may_leave != nullptr && (*outcome->may_leave)();
            if (!leaves) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          }
          if (leaves) {
            kind_.committed = kind_.yielded = true;
            kind_.cv.NotifyAll();
            waited([&]() REQUIRES(kind_.mu) { return kind_.ahead_began; },
                   std::chrono::milliseconds(500));
            outcome->yielded = true;
            return Status::Ok();
          }
        }
      }
      return Made(item, out, outcome);
    }

   private:
    const HandOverKind& kind_;
  };
};

// A worker that commits to leave mid-item, then yields it, finds a worker
// free to continue it: none starts the next epoch's items (which wait for
// the consumer to start that epoch) meanwhile, or the epoch never ends.
TEST(WorkerKindTest, AnItemHandedOverIsNotLeftBehindTheNextEpochsItems) {
  auto kind = std::make_shared<HandOverKind>();
  LoaderOptions o = KindOptions(kind, 2);
  o.prefetch_batches = 8;
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  std::vector<int64_t> got;
  for (int64_t epoch = 0; epoch < 2; ++epoch) {
    kind->StartEpoch(epoch);
    while (true) {
      if (epoch == 0 && got.size() == 2) {  // items 2 and 3 are being made
        for (int i = 0; i < 1000 && kind->running.load() < 2; ++i) {
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        ASSERT_TRUE(loader->Resize(1).ok());
        kind->Shrunk();
      }
      ASSERT_TRUE(loader->WaitReady(std::chrono::seconds(5))) << "epoch " << epoch << " stuck";
      auto r = loader->Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      got.push_back((*r)->labels()[0]);
    }
  }
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 3, 0, 1, 2, 3}));
  kind->StartEpoch(2);  // epoch 2's items, made ahead, end before the loader does
  MutexLock lock(kind->mu);
  EXPECT_TRUE(kind->yielded);
}

// Four items an epoch. In epoch 0 items 1.. never end on their own (a
// sharded stream's endless shard); items of later epochs take kSlow. Each
// stops unmade (ItemOutcome::dropped) once its epoch is abandoned
// (ItemOutcome::abandoned); an endless one still going after kLimit counts
// as overrun and is made.
class EndlessKind : public WorkerKind {
 public:
  static constexpr auto kLimit = std::chrono::seconds(60);
  static constexpr auto kSlow = std::chrono::milliseconds(20);
  static constexpr int64_t kEpochs = 8;
  SampleSpec spec() const override { return {{2}, DType::kInt64}; }
  int64_t items() const override { return 4; }
  std::string Key(int64_t item) const override { return "item " + std::to_string(item); }
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace, const SampleCap&) const override {
    return std::make_unique<Worker>(*this);
  }

  mutable std::atomic<int> endless{0};  // workers inside an endless item now
  mutable std::atomic<int> overran{0};  // endless items that ran to kLimit
  // By epoch: items begun, and items dropped.
  mutable std::array<std::atomic<int>, kEpochs> began{}, dropped{};

 private:
  class Worker : public KindWorker {
   public:
    explicit Worker(const EndlessKind& kind) : kind_(kind) {}
    Status Run(int64_t epoch, int64_t item, std::span<std::byte> out,
               ItemOutcome* outcome) override {
      const bool endless = epoch == 0 && item > 0;
      const auto e = static_cast<size_t>(std::min(epoch, kEpochs - 1));
      kind_.began[e].fetch_add(1);
      const auto until = std::chrono::steady_clock::now() + (endless ? kLimit : kSlow);
      std::atomic<int> none{0};
      const InRun in_run(endless ? kind_.endless : none);
      while (std::chrono::steady_clock::now() < until) {
        if (outcome->Abandoned()) {
          kind_.dropped[e].fetch_add(1);
          outcome->dropped = true;
          return Status::Ok();
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (endless) kind_.overran.fetch_add(1);
      return Made(item, out, outcome);
    }

   private:
    const EndlessKind& kind_;
  };
};

// The consumer leaves epoch 0 after its first item (a `break`) and starts
// epoch 1: the workers in epoch 0's endless items stop them at once, unmade,
// and epoch 1 comes whole, each item once, and epoch 2 after it.
TEST(WorkerKindTest, ItemsOfAnAbandonedEpochStopAndTheNextEpochComesWhole) {
  auto kind = std::make_shared<EndlessKind>();
  LoaderOptions o = KindOptions(kind, 2);
  o.prefetch_batches = 4;
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  {
    auto first = loader->Next();
    ASSERT_TRUE(first.ok()) << first.status().ToString();
    ASSERT_TRUE(first->has_value());
    EXPECT_EQ((*first)->labels()[0], 0);
  }
  for (int i = 0; i < 5000 && kind->endless.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_EQ(kind->endless.load(), 2);  // both workers are in endless items
  ASSERT_TRUE(loader->SetEpoch(1).ok());
  for (int64_t epoch = 1; epoch < 3; ++epoch) {
    const Drained d = DrainEpoch(*loader);
    EXPECT_TRUE(d.errors.empty()) << d.errors[0].ToString();
    EXPECT_EQ(d.items, (std::vector<int64_t>{0, 1, 2, 3})) << "epoch " << epoch;
  }
  EXPECT_EQ(kind->overran.load(), 0);
  EXPECT_EQ(kind->dropped[0].load(), 2);
  EXPECT_EQ(kind->dropped[1].load() + kind->dropped[2].load(), 0);
}

// SetEpoch keeps the look-ahead epoch when it is the one asked for: its
// items, in progress as the epoch before is abandoned, are made, not
// dropped, and it comes whole.
TEST(WorkerKindTest, ALookAheadEpochThatSetEpochKeepsIsNotDropped) {
  auto kind = std::make_shared<EndlessKind>();
  LoaderOptions o = KindOptions(kind, 2);
  o.prefetch_batches = 8;
  o.start_epoch = 1;  // no endless items
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  EXPECT_EQ(DrainEpoch(*loader).items, (std::vector<int64_t>{0, 1, 2, 3}));
  {
    auto r = loader->Next();  // epoch 2's first item
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->has_value());
  }
  for (int i = 0; i < 5000 && kind->began[3].load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(kind->began[3].load(), 0);    // epoch 3 is made ahead
  ASSERT_TRUE(loader->SetEpoch(3).ok());  // epoch 2 abandoned, epoch 3 kept
  const Drained d = DrainEpoch(*loader);
  EXPECT_TRUE(d.errors.empty()) << d.errors[0].ToString();
  EXPECT_EQ(d.items, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(kind->dropped[3].load(), 0);
}

TEST(WorkerKindTest, MakeRefusesAKindBesideASource) {
  auto o = testing::SyntheticLoaderOptions(10, 2, 8);
  o.kind = std::make_shared<FakeKind>(5, std::set<int64_t>{});
  auto made = testing::MakeUntuned(o);
  ASSERT_FALSE(made.ok());
  EXPECT_NE(made.status().message().find("'kind'"), std::string::npos);
}

}  // namespace
}  // namespace stoker
