#include "stoker/loader.h"

#include <dirent.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "engine/run_delay.h"
#include "stoker/defaults.h"
#include "testing/loader_harness.h"
#include "testing/sanitizers.h"
#include "testing/untuned_loader.h"

namespace stoker {
namespace {

using testing::BatchCopy;
using testing::DrainEpoch;
using testing::MakeUntunedLoader;
using testing::SyntheticLoaderOptions;

std::multiset<int64_t> Samples(const std::map<int64_t, BatchCopy>& epoch) {
  std::multiset<int64_t> s;
  for (auto& [i, b] : epoch) s.insert(b.samples.begin(), b.samples.end());
  return s;
}

std::multiset<int64_t> Range(int64_t n) {
  std::multiset<int64_t> s;
  for (int64_t i = 0; i < n; ++i) s.insert(i);
  return s;
}

TEST(LoaderTest, DeliversEverySampleOnceInOrder) {
  auto o = SyntheticLoaderOptions(1000, 64, 24);
  o.workers = 3;
  auto loader = MakeUntunedLoader(o);
  EXPECT_EQ(loader->batches_per_epoch(), 16);
  int64_t expect = 0;
  std::multiset<int64_t> seen;
  while (true) {
    auto r = loader->Next();
    ASSERT_TRUE(r.ok());
    if (!r->has_value()) break;
    const Batch& b = **r;
    EXPECT_EQ(b.index(), expect++);
    EXPECT_EQ(b.size(), b.index() == 15 ? 1000 - 15 * 64 : 64);
    EXPECT_EQ(b.data().size(), static_cast<size_t>(b.size()) * 24);
    for (int64_t i = 0; i < b.size(); ++i) {
      EXPECT_EQ(b.labels()[static_cast<size_t>(i)],
                b.sample_indices()[static_cast<size_t>(i)] % 10);
    }
    seen.insert(b.sample_indices().begin(), b.sample_indices().end());
  }
  EXPECT_EQ(seen, Range(1000));
  EXPECT_EQ(loader->epoch(), 1);  // the next Next() starts epoch 1
}

TEST(LoaderTest, ConsumerThreadDoesTheWorkWithZeroWorkers) {
  auto o = SyntheticLoaderOptions(300, 7, 8);
  o.workers = 0;
  auto loader = MakeUntunedLoader(o);
  auto epoch = DrainEpoch(*loader);
  EXPECT_EQ(Samples(epoch), Range(300));
  auto m = loader->Metrics();
  EXPECT_EQ(m.workers_running, 0);
  EXPECT_EQ(m.samples_produced, 300);
}

// With no workers Next() makes the batch itself: an interrupt ends it after
// the sample being made, and the calls after it make the rest of that batch,
// every sample once, in order.
TEST(LoaderTest, AnInterruptEndsABatchMadeOnTheConsumersThreadWhichGoesOnAfter) {
  auto o = SyntheticLoaderOptions(300, 50, 8);
  o.workers = 0;
  auto loader = MakeUntunedLoader(o);
  int asked = 0;
  int interrupts = 0;
  loader->SetInterrupt([&] { return ++asked % 17 == 0; });  // a Ctrl-C every 17 samples
  std::vector<int64_t> seen;
  int64_t batch = 0;
  while (true) {
    auto r = loader->Next();
    if (!r.ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
      ++interrupts;
      continue;
    }
    if (!r->has_value()) break;
    EXPECT_EQ((**r).index(), batch++);
    EXPECT_EQ((**r).size(), 50);
    seen.insert(seen.end(), (**r).sample_indices().begin(), (**r).sample_indices().end());
  }
  EXPECT_EQ(std::multiset<int64_t>(seen.begin(), seen.end()), Range(300));
  EXPECT_EQ(asked, 300);  // after each sample, none made twice
  EXPECT_EQ(interrupts, 300 / 17);
  EXPECT_EQ(loader->Metrics().samples_produced, 300);
}

TEST(LoaderTest, UnorderedDeliveryCoversTheEpoch) {
  auto o = SyntheticLoaderOptions(500, 10, 8);
  o.workers = 4;
  o.ordered = false;
  auto loader = MakeUntunedLoader(o);
  auto epoch = DrainEpoch(*loader);
  EXPECT_EQ(epoch.size(), 50u);
  EXPECT_EQ(Samples(epoch), Range(500));
}

TEST(LoaderTest, EpochsDifferAndRepeatWithTheSeed) {
  auto o = SyntheticLoaderOptions(200, 16, 8);
  auto a = MakeUntunedLoader(o);
  auto e0 = DrainEpoch(*a);
  auto e1 = DrainEpoch(*a);
  EXPECT_NE(e0, e1);
  o.start_epoch = 1;
  o.workers = 1;
  auto b = MakeUntunedLoader(o);
  EXPECT_EQ(DrainEpoch(*b), e1);
}

TEST(LoaderTest, DropLastDropsTheShortBatch) {
  auto o = SyntheticLoaderOptions(100, 30, 8);
  o.drop_last = true;
  auto loader = MakeUntunedLoader(o);
  auto epoch = DrainEpoch(*loader);
  EXPECT_EQ(epoch.size(), 3u);
  EXPECT_EQ(loader->samples_per_epoch(), 90);
}

// Drains an epoch that may return errors: the errors' messages and the
// samples delivered, as a consumer that catches each error and goes on.
struct Outcome {
  std::vector<Status> errors;
  std::multiset<int64_t> samples;
};
Outcome DrainCatching(Loader& loader) {
  Outcome out;
  for (int calls = 0; calls < 10000; ++calls) {
    auto r = loader.Next();
    if (!r.ok()) {
      out.errors.push_back(r.status());
      continue;
    }
    if (!r->has_value()) break;
    out.samples.insert((*r)->sample_indices().begin(), (*r)->sample_indices().end());
  }
  return out;
}

TEST(LoaderTest, RaisePolicyNamesTheSampleThenDeliversTheRestOfItsBatch) {
  SyntheticOptions so;
  so.fail_indices = {17};
  auto o = SyntheticLoaderOptions(100, 10, 8, so);
  o.shuffle = false;
  o.workers = 2;
  auto loader = MakeUntunedLoader(o);
  Outcome out = DrainCatching(*loader);
  ASSERT_EQ(out.errors.size(), 1u);
  const Status& e = out.errors[0];
  EXPECT_EQ(e.code(), StatusCode::kDataError);
  EXPECT_NE(e.message().find("sample 17"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("synthetic:17"), std::string::npos);
  EXPECT_NE(e.message().find("batch 1"), std::string::npos);
  EXPECT_EQ(out.samples.size(), 99u);  // every good sample, batch 1's included
  EXPECT_EQ(out.samples.count(15), 1u);
  EXPECT_EQ(out.samples.count(17), 0u);
}

TEST(LoaderTest, EveryBadSampleOfABatchIsNamedOnceInEveryEpoch) {
  SyntheticOptions so;
  so.fail_indices = {12, 17, 40};
  auto o = SyntheticLoaderOptions(100, 10, 8, so);
  o.workers = 3;
  auto loader = MakeUntunedLoader(o);
  for (int epoch = 0; epoch < 2; ++epoch) {
    Outcome out = DrainCatching(*loader);
    std::string all;
    for (const Status& e : out.errors) all += e.message() + "\n";
    for (int64_t bad : {12, 17, 40}) {
      const std::string name = "sample " + std::to_string(bad) + " ";
      const size_t at = all.find(name);
      EXPECT_NE(at, std::string::npos) << all;
      EXPECT_EQ(all.find(name, at + 1), std::string::npos) << "named twice: " << all;
    }
    EXPECT_EQ(out.samples.size(), 97u);
  }
}

// A synthetic source whose reads of some samples fail the way a machine out
// of file descriptors does (EMFILE), and of others throw.
class RefusingSource final : public Source {
 public:
  explicit RefusingSource(std::shared_ptr<const Source> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override {
    if (index == 33) return ErrnoError("open /data/33.jpg", EMFILE);
    if (index == 34) throw std::bad_alloc();
    if (index == 35) throw std::runtime_error("a bug in a user's source");
    return inner_->Read(index, buffer, record);
  }
  std::string Key(int64_t index) const override { return inner_->Key(index); }

 private:
  std::shared_ptr<const Source> inner_;
};

TEST(LoaderTest, SkipPolicyNeverSkipsWhatIsNotTheSamplesFault) {
  SyntheticOptions so;
  so.fail_indices = {5};
  auto o = SyntheticLoaderOptions(100, 10, 8, so);
  o.source = std::make_shared<RefusingSource>(o.source);
  o.on_error = ErrorPolicy::kSkip;
  o.shuffle = false;
  o.workers = 2;
  auto loader = MakeUntunedLoader(o);
  Outcome out = DrainCatching(*loader);
  ASSERT_EQ(out.errors.size(), 1u);  // batch 3 (samples 30..39), naming all three
  const Status& e = out.errors[0];
  EXPECT_EQ(e.code(), StatusCode::kUnavailable) << e.ToString();
  EXPECT_NE(e.message().find("sample 33"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("Too many open files"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("sample 34"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("out of memory"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("sample 35"), std::string::npos) << e.message();
  EXPECT_NE(e.message().find("a bug in a user's source"), std::string::npos) << e.message();
  // The data error alone was skipped; everything else was delivered.
  auto skipped = loader->Skipped();
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_EQ(skipped[0].index, 5);
  EXPECT_EQ(out.samples.size(), 96u);
  EXPECT_EQ(out.samples.count(36), 1u);
}

// A long run over bad files, epoch after epoch, kept every skip record: the
// list grew without bound.
TEST(LoaderTest, SkipRecordsAreKeptUpToTheirLimitAndCountedPastIt) {
  constexpr int64_t kSamples = 40'001, kEpochs = 3;  // all bad but the last
  SyntheticOptions so;
  for (int64_t i = 0; i + 1 < kSamples; ++i) so.fail_indices.push_back(i);
  auto o = SyntheticLoaderOptions(kSamples, 1, 512, so);
  o.on_error = ErrorPolicy::kSkip;
  o.shuffle = false;
  o.workers = 2;
  auto loader = MakeUntunedLoader(o);
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    int64_t delivered = 0;
    while (true) {
      auto r = loader->Next();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      if (!r->has_value()) break;
      delivered += static_cast<int64_t>((**r).size());
    }
    EXPECT_EQ(delivered, 1);
  }
  const std::vector<SkipRecord> skipped = loader->Skipped();
  ASSERT_EQ(skipped.size(), kSkipRecordsKept);
  EXPECT_EQ(loader->Metrics().samples_skipped, kEpochs * (kSamples - 1));
  EXPECT_EQ(skipped.front().epoch, 0);
  EXPECT_EQ(skipped.back().epoch, 2);  // the first records, in delivery order
  EXPECT_EQ(skipped.back().index, kSkipRecordsKept - 2 * (kSamples - 1) - 1);
}

// Under kSkip, an epoch whose every sample is bad delivers nothing: it ends
// with an error naming the epoch and the skips, not a quiet end of epoch
// after which a training loop would spin through empty epochs for ever.
TEST(LoaderTest, AnEpochWhoseEverySampleWasSkippedIsAnError) {
  SyntheticOptions so;
  for (int64_t i = 0; i < 30; ++i) so.fail_indices.push_back(i);
  auto o = SyntheticLoaderOptions(30, 8, 8, so);
  o.on_error = ErrorPolicy::kSkip;
  o.shuffle = false;
  for (int workers : {0, 2}) {
    o.workers = workers;
    auto loader = MakeUntunedLoader(o);
    auto r = loader->Next();
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataError);
    EXPECT_EQ(r.status().message(),
              "epoch 0 delivered nothing: all 30 samples were skipped (first: synthetic:0: data "
              "error: injected failure)");
    EXPECT_EQ(loader->Skipped().size(), 30u);
    // The call after it starts the next epoch, which says the same.
    r = loader->Next();
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("epoch 1 delivered nothing"), std::string::npos)
        << r.status().message();
  }
  // One good sample is enough for an ordinary end of epoch.
  so.fail_indices.pop_back();
  o = SyntheticLoaderOptions(30, 8, 8, so);
  o.on_error = ErrorPolicy::kSkip;
  auto loader = MakeUntunedLoader(o);
  EXPECT_EQ(Samples(DrainEpoch(*loader)).size(), 1u);
}

TEST(LoaderTest, SkipPolicyRecordsEverySkippedSample) {
  SyntheticOptions so;
  so.fail_indices = {0, 5, 6, 99};
  auto o = SyntheticLoaderOptions(100, 8, 8, so);
  o.on_error = ErrorPolicy::kSkip;
  o.workers = 3;
  auto loader = MakeUntunedLoader(o);
  auto epoch = DrainEpoch(*loader);
  auto seen = Samples(epoch);
  EXPECT_EQ(seen.size(), 96u);
  auto skipped = loader->Skipped();
  ASSERT_EQ(skipped.size(), 4u);
  std::set<int64_t> skipped_ids;
  for (auto& s : skipped) {
    skipped_ids.insert(s.index);
    EXPECT_EQ(s.key, "synthetic:" + std::to_string(s.index));
    // The record names the sample in its own fields: the reason is the cause.
    EXPECT_EQ(s.reason, "data error: injected failure");
    EXPECT_EQ(seen.count(s.index), 0u);
  }
  EXPECT_EQ(skipped_ids, (std::set<int64_t>{0, 5, 6, 99}));
  // Survivors keep their data: compare with a run that has no failures.
  auto clean = MakeUntunedLoader(SyntheticLoaderOptions(100, 8, 8));
  auto clean_epoch = DrainEpoch(*clean);
  for (auto& [i, b] : epoch) {
    const BatchCopy& c = clean_epoch.at(i);
    size_t k = 0;
    for (size_t p = 0; p < c.samples.size(); ++p) {
      if (skipped_ids.count(c.samples[p])) continue;
      EXPECT_EQ(b.samples[k], c.samples[p]);
      EXPECT_TRUE(std::equal(b.data.begin() + static_cast<long>(k * 8),
                             b.data.begin() + static_cast<long>(k * 8 + 8),
                             c.data.begin() + static_cast<long>(p * 8)));
      ++k;
    }
    EXPECT_EQ(k, b.samples.size());
  }
}

// A source whose reads of samples from `free_below` on block until Open();
// it counts the reads that blocked and those that have returned.
class GatedSource final : public Source {
 public:
  GatedSource(int64_t size, size_t sample_bytes, int64_t free_below)
      : size_(size), sample_bytes_(sample_bytes), free_below_(free_below) {}

  int64_t size() const override { return size_; }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override {
    {
      std::lock_guard lock(mu_);
      readers_.insert(gettid());
    }
    if (index >= free_below_) {
      std::unique_lock lock(mu_);
      ++blocked_;
      opened_.wait(lock, [this] { return open_; });
      ++released_;
    }
    buffer.bytes.assign(sample_bytes_, std::byte{0});
    record->bytes = buffer.bytes;
    record->label = index % 10;
    return Status::Ok();
  }
  std::string Key(int64_t index) const override { return "gated:" + std::to_string(index); }

  void Open() {
    {
      std::lock_guard lock(mu_);
      open_ = true;
    }
    opened_.notify_all();
  }
  int64_t blocked() const {
    std::lock_guard lock(mu_);
    return blocked_;
  }
  int64_t released() const {
    std::lock_guard lock(mu_);
    return released_;
  }
  // The threads that have called Read.
  std::set<pid_t> readers() const {
    std::lock_guard lock(mu_);
    return readers_;
  }

 private:
  const int64_t size_;
  const size_t sample_bytes_;
  const int64_t free_below_;
  mutable std::mutex mu_;
  mutable std::condition_variable opened_;
  bool open_ = false;
  mutable int64_t blocked_ = 0;
  mutable int64_t released_ = 0;
  mutable std::set<pid_t> readers_;
};

// Polls `done` until it holds; false after a minute (far beyond anything
// these tests wait for: it only turns a hang into a failure).
template <typename F>
bool WaitUntil(F done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!done()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

// Opens a GatedSource when the test leaves, however it leaves: an early
// return must not leave the loader's workers blocked.
struct OpenOnExit {
  GatedSource* source;
  ~OpenOnExit() { source->Open(); }
};

// Whether thread `tid` of this process still exists.
bool ThreadExists(pid_t tid) {
  std::error_code ec;
  return std::filesystem::exists("/proc/self/task/" + std::to_string(tid), ec);
}

// A source whose samples below `bad_below` are bad (the sample's fault); the
// others it reads from `inner`.
class BadBelowSource final : public Source {
 public:
  BadBelowSource(std::shared_ptr<const Source> inner, int64_t bad_below)
      : inner_(std::move(inner)), bad_below_(bad_below) {}
  int64_t size() const override { return inner_->size(); }
  Status Read(int64_t index, ReadBuffer& buffer, Record* record) const override {
    if (index < bad_below_) return DataError("not an image");
    return inner_->Read(index, buffer, record);
  }
  std::string Key(int64_t index) const override { return inner_->Key(index); }

 private:
  std::shared_ptr<const Source> inner_;
  const int64_t bad_below_;
};

// Under kSkip, batches whose every sample was skipped are not "ready": they
// sent a consumer waiting in slices (to notice Ctrl-C) into a Next() that
// passed over them and blocked until a batch came, deaf to the signal.
TEST(LoaderTest, WaitReadyPassesOverBatchesWhoseEverySampleWasSkipped) {
  constexpr int64_t kBatch = 4;
  // Batches 0..3 are all bad; the reads of batch 4 on block until Open().
  auto gated = std::make_shared<GatedSource>(100, 8, 4 * kBatch);
  auto o = SyntheticLoaderOptions(100, kBatch, 8);
  o.source = std::make_shared<BadBelowSource>(gated, 4 * kBatch);
  o.on_error = ErrorPolicy::kSkip;
  o.shuffle = false;
  o.workers = 1;
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  OpenOnExit open_on_exit{gated.get()};
  EXPECT_FALSE(loader->WaitReady(std::chrono::milliseconds(300)));
  gated->Open();
  ASSERT_TRUE(loader->WaitReady(std::chrono::seconds(60)));
  auto batch = loader->Next();
  ASSERT_TRUE(batch.ok() && batch->has_value()) << batch.status().ToString();
  EXPECT_EQ((**batch).index(), 4);
  EXPECT_EQ((**batch).sample_indices()[0], 4 * kBatch);
  EXPECT_EQ(loader->Skipped().size(), static_cast<size_t>(4 * kBatch));
}

TEST(LoaderTest, DestroyMidEpochWithBlockedWorkersReturns) {
  constexpr int64_t kBatch = 4;
  // Batch 0 reads freely; every later read blocks inside Source::Read.
  auto source = std::make_shared<GatedSource>(1000, 8, kBatch);
  auto o = SyntheticLoaderOptions(1000, kBatch, 8);
  o.source = source;
  o.shuffle = false;
  o.workers = 6;
  o.prefetch_batches = 2;  // two workers block in Read, four on the full window
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  OpenOnExit open_on_exit{source.get()};

  auto first = loader->Next();
  ASSERT_TRUE(first.ok() && first->has_value()) << first.status().ToString();
  ASSERT_TRUE(WaitUntil([&] { return source->blocked() >= 2; }))
      << "workers never blocked in Read: " << source->blocked();
  EXPECT_EQ(source->released(), 0);
  std::set<pid_t> workers = source->readers();
  workers.erase(gettid());
  ASSERT_GE(workers.size(), 2u);
  for (pid_t tid : workers) EXPECT_TRUE(ThreadExists(tid)) << "worker " << tid;

  // Destroy the loader while its workers are blocked, then let the reads go:
  // destruction must wake the workers on the window and join every worker.
  std::promise<void> destroyed;
  std::thread destroyer([&] {
    loader.reset();
    destroyed.set_value();
  });
  source->Open();
  if (destroyed.get_future().wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    ADD_FAILURE() << "the loader's destructor has not returned after 60 s";
    std::fprintf(stderr, "watchdog: Loader destructor hung with blocked workers; aborting\n");
    std::abort();  // the destroyer cannot be joined
  }
  destroyer.join();
  EXPECT_EQ(source->released(), source->blocked()) << "a read still blocked after destruction";
  // Joined, not merely woken: no thread that read for the loader outlives it
  // (polled: a joined thread's /proc entry goes a moment after the join).
  for (pid_t tid : source->readers()) {
    if (tid == gettid()) continue;
    EXPECT_TRUE(WaitUntil([&] { return !ThreadExists(tid); }))
        << "worker " << tid << " outlived it";
  }
}

TEST(LoaderTest, StopWithinGivesUpOnAReadThatDoesNotReturnAndNamesItsSample) {
  // Every read blocks until opened: both workers hold a sample.
  auto source = std::make_shared<GatedSource>(64, 8, 0);
  auto o = SyntheticLoaderOptions(64, 4, 8);
  o.source = source;
  o.workers = 2;
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  OpenOnExit open_on_exit{source.get()};
  std::optional<StatusCode> got;
  std::thread consumer([&] { got = loader->Next().status().code(); });  // starts the epoch
  ASSERT_TRUE(WaitUntil([&] { return source->blocked() >= 2; }));

  EXPECT_FALSE(loader->StopWithin(std::chrono::milliseconds(50)));
  consumer.join();  // woken, though its batch's reads still hang
  EXPECT_EQ(got, StatusCode::kCancelled);
  const std::vector<ItemInProgress> held = loader->InProgress();
  ASSERT_EQ(held.size(), 2u);
  for (const ItemInProgress& h : held) {
    EXPECT_EQ(h.name,
              "sample " + std::to_string(h.item) + " (gated:" + std::to_string(h.item) + ")");
  }
  EXPECT_NE(held[0].worker, held[1].worker);

  source->Open();  // the reads return: the workers leave
  EXPECT_TRUE(loader->StopWithin(std::chrono::seconds(60)));
  EXPECT_TRUE(loader->InProgress().empty());
}

TEST(LoaderTest, AwaitedNamesTheBatchTheConsumerSleepsOnWithItsItems) {
  constexpr int64_t kBatch = 4;
  // Every read blocks until opened: the consumer sleeps on batch 0.
  auto source = std::make_shared<GatedSource>(64, 8, 0);
  auto o = SyntheticLoaderOptions(64, kBatch, 8);
  o.source = source;
  o.shuffle = true;
  o.workers = 2;
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  OpenOnExit open_on_exit{source.get()};
  EXPECT_FALSE(loader->Awaited().has_value());  // the consumer is not inside Next()

  std::optional<BatchCopy> first;
  std::thread consumer([&] {
    auto b = loader->Next();
    if (b.ok() && b->has_value()) first = testing::Copy(**b);
  });
  std::optional<AwaitedBatch> head;
  EXPECT_TRUE(WaitUntil([&] {
    head = loader->Awaited();
    return head.has_value() && head->waited_ns > 0;
  }));
  source->Open();
  consumer.join();
  ASSERT_TRUE(head.has_value() && first.has_value());
  EXPECT_EQ(head->epoch, 0);
  EXPECT_EQ(head->batch, 0);
  // The items of the batch it then got, in plan order (shuffled).
  EXPECT_EQ(head->items, first->samples);
  EXPECT_FALSE(loader->Awaited().has_value());  // it left Next() with its batch
}

TEST(LoaderTest, StopWakesAWaitingConsumer) {
  SyntheticOptions so;
  so.read_latency = std::chrono::milliseconds(50);
  auto o = SyntheticLoaderOptions(1000, 64, 8, so);
  o.workers = 1;
  auto loader = MakeUntunedLoader(o);
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    loader->Stop();
  });
  auto r = loader->Next();
  stopper.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(loader->Next().status().code(), StatusCode::kCancelled);
}

TEST(LoaderTest, ResumesFromCheckpointWithOtherWorkerCounts) {
  for (bool ordered : {true, false}) {
    auto o = SyntheticLoaderOptions(640, 32, 16);
    o.seed = 11;
    o.ordered = ordered;
    o.workers = 3;
    auto reference = DrainEpoch(*MakeUntunedLoader(o));

    auto first = MakeUntunedLoader(o);
    std::map<int64_t, BatchCopy> got;
    for (int i = 0; i < 7; ++i) {
      auto r = first->Next();
      ASSERT_TRUE(r.ok() && r->has_value());
      got.emplace((*r)->index(), testing::Copy(**r));
    }
    LoaderState state = *first->State();
    EXPECT_EQ(state.epoch, 0);
    first.reset();

    for (int workers : {0, 1, 5}) {
      o.workers = workers;
      auto resumed = MakeUntunedLoader(o);
      ASSERT_TRUE(resumed->Restore(state).ok());
      auto rest = DrainEpoch(*resumed);
      EXPECT_EQ(rest.size(), 20u - 7u);
      auto all = got;
      for (auto& [i, b] : rest) EXPECT_TRUE(all.emplace(i, b).second) << "batch " << i << " twice";
      EXPECT_EQ(all, reference) << "ordered=" << ordered << " workers=" << workers;
    }
  }
}

// A resumed loop calls SetEpoch at each epoch's start, as it always does:
// SetEpoch of the checkpoint's epoch keeps it; of another epoch, drops it.
TEST(LoaderTest, SetEpochOfARestoredCheckpointsEpochKeepsIt) {
  auto o = SyntheticLoaderOptions(640, 32, 16);
  o.seed = 5;
  o.workers = 2;
  auto first = MakeUntunedLoader(o);
  ASSERT_TRUE(first->SetEpoch(3).ok());
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(first->Next().ok());
  const LoaderState state = *first->State();
  const auto rest = DrainEpoch(*first);
  ASSERT_EQ(rest.size(), 15u);
  first.reset();

  auto resumed = MakeUntunedLoader(o);
  ASSERT_TRUE(resumed->Restore(state).ok());
  ASSERT_TRUE(resumed->SetEpoch(3).ok());
  EXPECT_EQ(DrainEpoch(*resumed), rest);

  auto other = MakeUntunedLoader(o);
  ASSERT_TRUE(other->Restore(state).ok());
  ASSERT_TRUE(other->SetEpoch(4).ok());
  EXPECT_EQ(DrainEpoch(*other).size(), 20u) << "epoch 4, whole";
}

TEST(LoaderTest, RestoreRejectsForeignCheckpoints) {
  auto loader = MakeUntunedLoader(SyntheticLoaderOptions(100, 10, 8));
  const LoaderState own = *loader->State();
  LoaderState s = own;
  s.seed = 99;
  EXPECT_NE(loader->Restore(s).message().find("seed"), std::string::npos);
  s = own;
  s.position = 11;
  EXPECT_NE(loader->Restore(s).message().find("position"), std::string::npos);
}

// A checkpoint of another plan would put other samples at its positions:
// each setting that makes the plan is checked, and the loader is untouched.
TEST(LoaderTest, RestoreRefusesACheckpointOfAnotherPlan) {
  auto o = SyntheticLoaderOptions(100, 10, 8);
  o.workers = 2;
  auto other = o;
  other.batch_size = 20;
  auto taken = MakeUntunedLoader(other);
  ASSERT_TRUE(taken->Next().ok());
  const LoaderState state = *taken->State();
  auto loader = MakeUntunedLoader(o);
  const Status st = loader->Restore(state);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(), "checkpoint's batch_size 20 differs from this loader's 10");
  EXPECT_EQ(Samples(DrainEpoch(*loader)), Range(100));  // the whole epoch, once
  for (auto change : std::vector<std::function<void(LoaderOptions&)>>{
           [](LoaderOptions& x) { x.shuffle = !x.shuffle; },
           [](LoaderOptions& x) { x.drop_last = true; },
           [](LoaderOptions& x) { x.world_size = 2; },
           [](LoaderOptions& x) {
             x.pad_shards = false;
             x.world_size = 3;
           },
           [](LoaderOptions& x) { x.source = SyntheticLoaderOptions(90, 10, 8).source; },
       }) {
    auto changed = o;
    change(changed);
    auto from = MakeUntunedLoader(changed);
    ASSERT_TRUE(from->Next().ok());
    EXPECT_EQ(loader->Restore(*from->State()).code(), StatusCode::kInvalidArgument);
  }
}

// The workers are threads, which fork() does not copy: in a forked child
// every consumer call refuses with an error saying so (instead of waiting for
// ever for workers that are not there) and the destructor returns; the
// parent's loader goes on untouched.
TEST(LoaderTest, AForkedChildGetsAnErrorNotAHang) {
#ifdef STOKER_SANITIZED
  GTEST_SKIP() << "sanitizer runtimes do not support fork() in a threaded process";
#else
  auto o = SyntheticLoaderOptions(200, 10, 8);
  o.workers = 3;
  auto loader = MakeUntunedLoader(o);
  auto first = loader->Next();
  ASSERT_TRUE(first.ok() && first->has_value());
  const pid_t parent = getpid();
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The exit code tells the parent what the child saw; 0: what it should.
    auto r = loader->Next();
    if (r.ok()) _exit(1);
    const std::string expected = "this stoker loader was made in process " +
                                 std::to_string(parent) +
                                 " and cannot be used in a forked child (pid " +
                                 std::to_string(getpid()) + "); make a new loader in the child";
    if (r.status().code() != StatusCode::kFailedPrecondition || r.status().message() != expected) {
      _exit(2);
    }
    const bool all_refused = loader->WaitReady(std::chrono::hours(1)) &&
                             !loader->SetEpoch(1).ok() && !loader->State().ok() &&
                             !loader->Restore(LoaderState{}).ok() && !loader->Resize(1).ok() &&
                             !loader->SetPrefetch(1, 1).ok() && !loader->CheckProcess().ok();
    if (!all_refused) _exit(3);
    if ((*first)->size() != 10) _exit(4);  // a batch from before the fork is readable
    *first = std::nullopt;                 // and goes without touching the parent's pool
    loader->Stop();
    loader.reset();  // joins nothing
    _exit(0);
  }
  // Polled, so that a child that hangs fails the test instead of hanging it.
  int status = 0;
  pid_t done = 0;
  for (int i = 0; i < 12000 && done == 0; ++i) {
    done = waitpid(pid, &status, WNOHANG);
    if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (done == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "the forked child hung";
  }
  ASSERT_EQ(done, pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "1: Next delivered; 2: another error; 3: a call was let by; 4: a batch was lost";
  EXPECT_TRUE(loader->CheckProcess().ok());
  EXPECT_EQ(DrainEpoch(*loader).size(), 19u);  // the rest of the parent's epoch
#endif
}

TEST(LoaderTest, SetEpochMidEpochStartsAFreshOne) {
  auto o = SyntheticLoaderOptions(300, 10, 8);
  o.workers = 3;
  auto loader = MakeUntunedLoader(o);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(loader->Next().ok());
  ASSERT_TRUE(loader->SetEpoch(4).ok());
  auto e4 = DrainEpoch(*loader);
  EXPECT_EQ(Samples(e4), Range(300));
  o.start_epoch = 4;
  EXPECT_EQ(DrainEpoch(*MakeUntunedLoader(o)), e4);
}

// Workers that only compute, four to a CPU, spend most of their task time
// waiting for a core: the metrics must say so (the tuner then knows this
// is no slow I/O). Where the kernel keeps no run-queue delay, it stays 0.
TEST(LoaderTest, CountsTimeWorkersQueueForACpu) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  const int cpus = CPU_COUNT(&allowed);
  SyntheticOptions so;
  so.cpu_cost = std::chrono::milliseconds(1);
  auto o = SyntheticLoaderOptions(200 * cpus, 8, 8, so);
  o.workers = 4 * cpus;
  auto loader = MakeUntunedLoader(o);
  ASSERT_NE(loader, nullptr);
  DrainEpoch(*loader, [](int64_t) {});
  const LoaderMetrics m = loader->Metrics();
  ASSERT_GT(m.busy_ns, 0);
  EXPECT_LE(m.queue_ns, m.busy_ns);
  if (RunDelayClock().ReadNanos() < 0) {
    EXPECT_EQ(m.queue_ns, 0);
    GTEST_SKIP() << "this kernel keeps no run-queue delay";
  }
  // Three quarters of the time in theory.
  EXPECT_GT(static_cast<double>(m.queue_ns), 0.3 * static_cast<double>(m.busy_ns))
      << "queued " << m.queue_ns << " ns of " << m.busy_ns << " ns busy";
}

// Threads of this process whose scheduling policy is `policy` (field 41 of
// /proc/self/task/TID/stat), -1 where /proc cannot tell.
int ThreadsWithPolicy(int policy) {
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  int n = 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(std::string("/proc/self/task/") + e->d_name + "/stat");
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');
    if (close == std::string::npos) continue;  // the thread ended meanwhile
    std::istringstream rest(text.substr(close + 1));
    std::string field;
    for (int i = 3; i <= 41 && rest >> field; ++i) {
      if (i == 41 && std::stoi(field) == policy) ++n;
    }
  }
  closedir(dir);
  return n;
}

TEST(LoaderTest, WorkersRunUnderBatchSchedulingAndTheConsumerDoesNot) {
  for (bool batch : {true, false}) {
    auto o = SyntheticLoaderOptions(200, 10, 8);
    o.workers = 3;
    o.batch_scheduling = batch;
    auto loader = MakeUntunedLoader(o);
    DrainEpoch(*loader);
    // A worker sets its policy first thing; one the kernel has not run yet
    // still has the default, so wait for all three (never more).
    const int want = batch ? 3 : 0;
    int seen = ThreadsWithPolicy(SCHED_BATCH);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (seen < want && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      seen = ThreadsWithPolicy(SCHED_BATCH);
    }
    EXPECT_EQ(seen, want) << "batch_scheduling " << batch;
    EXPECT_EQ(sched_getscheduler(0), SCHED_OTHER);  // this thread, the consumer
  }
}

TEST(LoaderTest, PrefetchesTheNextEpochBeforeItIsAskedFor) {
  auto o = SyntheticLoaderOptions(200, 10, 8);
  o.workers = 2;
  o.prefetch_batches = 4;
  auto loader = MakeUntunedLoader(o);
  auto e0 = DrainEpoch(*loader);  // ends with the nullopt of epoch 0
  // Without another Next(), workers fill the window with epoch 1's batches.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (loader->Metrics().ready_batches < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(loader->Metrics().ready_batches, 4);
  EXPECT_EQ(loader->epoch(), 1);
  auto e1 = DrainEpoch(*loader);
  o.start_epoch = 1;
  EXPECT_EQ(e1, DrainEpoch(*MakeUntunedLoader(o)));
}

TEST(LoaderTest, SetEpochAfterLookAheadGivesThatEpoch) {
  auto o = SyntheticLoaderOptions(120, 8, 8);
  o.workers = 3;
  for (int64_t next : {1, 5}) {
    auto loader = MakeUntunedLoader(o);
    DrainEpoch(*loader);
    ASSERT_TRUE(loader->SetEpoch(next).ok());  // 1: the epoch prefetched ahead; 5: another one
    auto got = DrainEpoch(*loader);
    auto ref_options = o;
    ref_options.start_epoch = next;
    EXPECT_EQ(got, DrainEpoch(*MakeUntunedLoader(ref_options))) << "epoch " << next;
  }
}

TEST(LoaderTest, ShardsTogetherCoverTheEpoch) {
  std::multiset<int64_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    auto o = SyntheticLoaderOptions(301, 16, 8);
    o.rank = rank;
    o.world_size = 3;
    o.pad_shards = false;
    auto epoch = DrainEpoch(*MakeUntunedLoader(o));
    auto s = Samples(epoch);
    EXPECT_EQ(s.size(), 100u);
    all.insert(s.begin(), s.end());
  }
  EXPECT_EQ(std::set<int64_t>(all.begin(), all.end()).size(), 300u);
  EXPECT_EQ(all.size(), 300u);
}

TEST(LoaderTest, BatchOutlivesTheLoader) {
  auto o = SyntheticLoaderOptions(100, 10, 8);
  auto loader = MakeUntunedLoader(o);
  auto r = loader->Next();
  ASSERT_TRUE(r.ok() && r->has_value());
  Batch kept = std::move(**r);
  BatchCopy before = testing::Copy(kept);
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(loader->Next().ok());
  loader.reset();
  EXPECT_EQ(testing::Copy(kept), before);
}

TEST(LoaderTest, MetricsAddUp) {
  auto o = SyntheticLoaderOptions(400, 20, 8);
  o.workers = 2;
  auto loader = MakeUntunedLoader(o);
  DrainEpoch(*loader);
  auto m = loader->Metrics();
  EXPECT_EQ(m.batches_delivered, 20);
  EXPECT_EQ(m.samples_delivered, 400);
  EXPECT_GE(m.samples_produced, 400);
  EXPECT_EQ(m.workers_target, 2);
  EXPECT_EQ(m.next_calls, 21);
  EXPECT_GT(m.consumer_wait_ns, 0);
  EXPECT_LE(m.bytes_in_flight, static_cast<size_t>(m.prefetch_batches) * m.batch_bytes);
}

TEST(LoaderTest, MakeRejectsBadOptions) {
  auto o = SyntheticLoaderOptions(100, 10, 8);
  o.workers = -2;  // -1 is kAutoWorkers
  EXPECT_NE(testing::MakeUntuned(o).status().message().find("workers"), std::string::npos);
  o.workers = kMaxWorkers + 1;
  EXPECT_NE(testing::MakeUntuned(o).status().message().find("workers"), std::string::npos);
  o = SyntheticLoaderOptions(100, 0, 8);
  EXPECT_NE(testing::MakeUntuned(o).status().message().find("batch_size"), std::string::npos);
  o = SyntheticLoaderOptions(100, 200, 8);
  o.drop_last = true;
  EXPECT_NE(testing::MakeUntuned(o).status().message().find("drop_last"), std::string::npos);
  o = SyntheticLoaderOptions(100, 10, 8);
  o.prefetch_batches = 0;
  EXPECT_NE(testing::MakeUntuned(o).status().message().find("prefetch_batches"), std::string::npos);
}

}  // namespace
}  // namespace stoker
