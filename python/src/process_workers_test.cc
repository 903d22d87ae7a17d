// ProcessWorkers and ProcessKind against a fake zygote: a C++ child that
// speaks worker_protocol.h as python/stoker/_workers.py does, forking fake
// workers that write a recognisable payload. The zygote is forked before the
// test starts a thread (ThreadSanitizer does not follow a fork after threads);
// it and its workers stay single-threaded.

#include "process_workers.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "stoker/rng.h"
#include "worker_message.h"

namespace stoker::python {
namespace {

using protocol::Tag;
using Descriptor = ProcessWorkers::Descriptor;
using D = protocol::ProcessDescriptor;

constexpr int64_t kSeed = 7;
// Samples that make the fake worker misbehave while its position names them.
constexpr int64_t kDies = 1'000'001;    // it kills itself with SIGTERM
constexpr int64_t kHangs = 1'000'002;   // it says so on the notify pipe, then waits forever
constexpr int64_t kRaises = 1'000'003;  // it reports the sample failed (SAMPFAIL) and skips it

// What the fake worker says of kRaises: the exception, the traceback, and
// the pickled exception's stand-in, binary (NULs) as a pickle is.
constexpr std::string_view kReason = "ValueError: bad sample";
constexpr std::string_view kTrace = "Traceback (most recent call last):\n  in __getitem__\n";
constexpr std::string_view kPickled{"\x80\x05\0pickled\0", 11};

// What the fake worker writes for a sample: the index and the batch's seed.
int64_t Payload(int64_t index, int64_t seed) { return index ^ seed; }

// Shards from kShardDies on kill their process at part kDiesAt (SIGTERM) when
// read from their start; from kShardAlwaysDies on, whenever they reach it.
constexpr int64_t kShardDies = 50, kShardAlwaysDies = 60, kDiesAt = 3;

// An item whose one index is kShard + s is a sharded stream's shard s: kParts
// parts, part k one word, Payload(s * 100 + k), each announced (PART) 5 ms
// apart. After YIELD it stops at its next part but the last (YIELDED): its
// resume is a shard's (worker_protocol.h). DONE's meta lists every part's offset.
constexpr int64_t kShard = 3'000'000;
constexpr int64_t kParts = 8;
// Shard kShardEndless has kEndlessParts parts: as far as a test goes, it
// never ends. After DROP a shard stops at its next part (DROPPED).
constexpr int64_t kShardEndless = 20, kEndlessParts = 20'000;

// Whether the parent sent `tag` (YIELD or DROP): then taken off the socket.
bool Asked(int sock, Tag::Index tag) {
  char got[protocol::kMaxMessageBytes];
  const ssize_t n = recv(sock, got, sizeof got, MSG_DONTWAIT | MSG_PEEK);
  if (n < static_cast<ssize_t>(protocol::kTagBytes)) return false;
  if (std::string_view(got, std::strlen(protocol::kMessages[tag].tag)) !=
      protocol::kMessages[tag].tag) {
    return false;
  }
  (void)!recv(sock, got, sizeof got, 0);
  return true;
}
bool YieldAsked(int sock) { return Asked(sock, Tag::kYield); }

// Runs shard `shard` of the TASK in `words`; false when it yielded or was
// dropped.
bool FakeShard(int sock, int64_t* words, int64_t size, int64_t shard,
               protocol::Words<protocol::DoneWord>* done) {
  const int64_t parts = shard == kShardEndless ? kEndlessParts : kParts;
  using H = protocol::SegmentWord;
  std::vector<int64_t> offsets;  // of the parts made, a continued shard's first
  if (words[H::kResumeLength] > 0) {
    const int64_t* resume = words + words[H::kResumeOffset] / 8;
    for (int64_t k = 0; k < resume[0]; ++k) offsets.push_back(resume[1 + 2 * k]);
  }
  int64_t at = words[H::kDataOffset];
  words[H::kPosition] = 0;
  bool leave = false;
  for (auto k = static_cast<int64_t>(offsets.size()); k < parts; ++k) {
    if (k == kDiesAt &&
        (shard >= kShardAlwaysDies || (shard >= kShardDies && words[H::kResumeLength] == 0))) {
      kill(getpid(), SIGTERM);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (Asked(sock, Tag::kDrop)) {
      words[H::kPosition] = -1;
      (void)SendMessage(sock, Tag::kDropped, {});
      return false;
    }
    leave = leave || YieldAsked(sock);
    words[at / 8] = Payload(shard * 100 + k, words[H::kSeed]);
    offsets.push_back(at);
    at += 8;
    using P = protocol::PartWord;
    protocol::Words<P> part{};
    part[P::kPart] = k;
    part[P::kSegmentSize] = size;
    part[P::kMetaOffset] = offsets.back();
    part[P::kMetaLength] = 8;
    (void)SendMessage(sock, Tag::kPart, part);
    if (k + 1 < parts && (leave || YieldAsked(sock))) {
      words[at / 8] = static_cast<int64_t>(offsets.size());
      for (size_t i = 0; i < offsets.size(); ++i) {
        words[at / 8 + 1 + 2 * i] = offsets[i];
        words[at / 8 + 2 + 2 * i] = 8;
      }
      using Y = protocol::YieldedWord;
      protocol::Words<Y> yielded{};
      yielded[Y::kSegmentSize] = size;
      yielded[Y::kResumeOffset] = at;
      yielded[Y::kResumeLength] = static_cast<int64_t>(2 * offsets.size() + 1) * 8;
      yielded[Y::kDataEnd] = at + yielded[Y::kResumeLength];
      words[H::kPosition] = -1;
      (void)SendMessage(sock, Tag::kYielded, yielded);
      return false;
    }
  }
  std::copy(offsets.begin(), offsets.end(), words + at / 8);
  words[H::kPosition] = -1;
  using W = protocol::DoneWord;
  (*done)[W::kSamples] = parts;
  (*done)[W::kSegmentSize] = size;
  (*done)[W::kMetaOffset] = at;
  (*done)[W::kMetaLength] = parts * 8;
  return true;
}

// Runs one TASK: the samples' payloads from the data offset, one word each,
// with the position on the sample being loaded; a SAMPFAIL on `sock` for
// each that raised. Returns the DONE words; none when a shard yielded.
std::optional<protocol::Words<protocol::DoneWord>> FakeTask(int sock, int64_t* words, int64_t size,
                                                            int notify) {
  using H = protocol::SegmentWord;
  const int64_t n = words[H::kSamples], data = words[H::kDataOffset];
  const int64_t* indices = words + protocol::kSegmentHeaderWords;
  if (n == 1 && indices[0] >= kShard) {
    protocol::Words<protocol::DoneWord> done{};
    if (!FakeShard(sock, words, size, indices[0] - kShard, &done)) return std::nullopt;
    return done;
  }
  int64_t* out = words + data / static_cast<int64_t>(sizeof(int64_t));
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    words[H::kPosition] = i;
    if (indices[i] == kDies) kill(getpid(), SIGTERM);
    if (indices[i] == kHangs) {
      const char byte = 1;
      (void)!write(notify, &byte, 1);
      while (true) pause();
    }
    if (indices[i] == kRaises) {
      using F = protocol::SampleFailWord;
      protocol::Words<F> failed{};
      failed[F::kIndex] = indices[i];
      failed[F::kExceptionBytes] = static_cast<int64_t>(kPickled.size());
      const std::string text =
          std::string(kReason) + '\0' + std::string(kTrace) + std::string(kPickled);
      (void)SendMessage(sock, Tag::kSampleFail, failed, -1, text);
      continue;
    }
    out[kept++] = Payload(indices[i], words[H::kSeed]);
  }
  words[H::kPosition] = -1;
  using W = protocol::DoneWord;
  protocol::Words<W> done{};
  done[W::kSamples] = kept;
  done[W::kSegmentSize] = size;
  done[W::kMetaOffset] = data;
  done[W::kMetaLength] = kept * static_cast<int64_t>(sizeof(int64_t));
  return done;
}

// A fake worker: greets, takes INIT (noting its base seed; its
// worker_init_fn takes `slow_ms`), then answers TASKs until EXIT (after
// which it takes `slow_ms` to end) or end of file.
[[noreturn]] void FakeWorker(int sock, int notify, int slow_ms) {
  // kDies needs SIGTERM's default action, whatever the test inherited.
  signal(SIGTERM, SIG_DFL);
  sigset_t term;
  sigemptyset(&term);
  sigaddset(&term, SIGTERM);
  sigprocmask(SIG_UNBLOCK, &term, nullptr);
  (void)SendMessage(sock, Tag::kHello, {});
  Result<Message> init = ReceiveMessage(sock);
  if (!init.ok() || init->tag != Tag::kInit) _exit(0);
  if (init->words[protocol::InitWord::kBaseSeed] != kSeed) _exit(4);
  std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
  (void)SendMessage(sock, Tag::kInitDone, {});
  std::map<int64_t, int> segments;  // id -> descriptor, sent with its first task
  while (true) {
    Result<Message> m = ReceiveMessage(sock);
    if (m.ok() && (m->tag == Tag::kYield || m->tag == Tag::kDrop)) continue;  // its shard ended
    if (m.ok() && m->tag == Tag::kExit) {
      std::this_thread::sleep_for(std::chrono::milliseconds(slow_ms));
      _exit(0);
    }
    if (!m.ok() || m->tag != Tag::kTask) _exit(0);
    using T = protocol::TaskWord;
    const int64_t id = m->words[T::kSegment], size = m->words[T::kSegmentSize];
    if (m->fd.valid()) segments[id] = m->fd.release();
    void* addr = mmap(nullptr, static_cast<size_t>(size), PROT_READ | PROT_WRITE, MAP_SHARED,
                      segments.at(id), 0);
    if (addr == MAP_FAILED) _exit(2);
    const auto done = FakeTask(sock, static_cast<int64_t*>(addr), size, notify);
    munmap(addr, static_cast<size_t>(size));
    if (done && !SendMessage(sock, Tag::kDone, *done).ok()) _exit(0);
  }
}

// FORK: a fake worker, its socket sent back with FORKED.
void ForkWorker(int ctl, int notify, int slow_ms, std::vector<int>& children) {
  int pair[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair) != 0) _exit(3);
  const int pid = fork();
  if (pid == 0) {
    close(ctl);
    close(pair[0]);
    FakeWorker(pair[1], notify, slow_ms);
  }
  close(pair[1]);
  children.push_back(pid);
  protocol::Words<protocol::ForkedWord> forked{};
  forked[protocol::ForkedWord::kPid] = pid;
  (void)SendMessage(ctl, Tag::kForked, forked, pair[0]);
  close(pair[0]);
}

// The fake zygote: FORK, REAP (waitpid, REAPED), and EXIT or end of file
// (kill the workers, collect them, exit 0).
[[noreturn]] void FakeZygote(int ctl, int notify, int slow_ms) {
  std::vector<int> children;
  while (true) {
    Result<Message> m = ReceiveMessage(ctl);
    if (!m.ok() || m->tag == Tag::kExit) {
      for (int pid : children) kill(pid, SIGKILL);
      for (int pid : children) waitpid(pid, nullptr, 0);
      _exit(0);
    }
    if (m->tag == Tag::kFork) {
      ForkWorker(ctl, notify, slow_ms, children);
    } else if (m->tag == Tag::kReap) {
      const auto pid = static_cast<int>(m->words[protocol::ReapWord::kPid]);
      int status = 0;
      waitpid(pid, &status, 0);
      std::erase(children, pid);
      using R = protocol::ReapedWord;
      protocol::Words<R> reaped{};
      reaped[R::kSignalled] = WIFSIGNALED(status) ? 1 : 0;
      reaped[R::kValue] = WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status);
      (void)SendMessage(ctl, Tag::kReaped, reaped);
    }
  }
}

// Forks the fake zygote (at once: before the test starts a thread) and makes
// the ProcessWorkers that talks to it; collects the zygote at the end.
class ProcessWorkersTest : public ::testing::Test {
 protected:
  // `item_name`: "shard" for a sharded stream's items (which may yield);
  // `persistent`: processes kept across epochs; `slow_ms`: each one's end.
  explicit ProcessWorkersTest(const std::string& item_name = "batch", bool persistent = true,
                              int slow_ms = 0) {
    int ctl[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl), 0);
    EXPECT_EQ(pipe2(notify_, O_CLOEXEC), 0);
    zygote_pid_ = fork();
    if (zygote_pid_ == 0) {
      close(ctl[0]);
      close(notify_[0]);
      FakeZygote(ctl[1], notify_[1], slow_ms);
    }
    close(ctl[1]);
    close(notify_[1]);
    batches_ = std::make_shared<EpochBatches>(kBatches, item_name);
    workers_ = std::make_shared<ProcessWorkers>(ctl[0], zygote_pid_, batches_, persistent);
    kind_ = std::make_unique<ProcessKind>(workers_);
  }
  ~ProcessWorkersTest() override {
    kind_.reset();
    workers_->Close();
    if (zygote_pid_ > 0) waitpid(zygote_pid_, nullptr, 0);
    close(notify_[0]);
  }

  // Epoch `epoch`: batch b holds kSamples indices from b * 100, with `odd`
  // (when given) in the middle of batch 0.
  void SetEpoch(int64_t epoch, int64_t odd = -1) {
    std::vector<int64_t> flat, offsets{0};
    for (int64_t b = 0; b < kBatches; ++b) {
      for (int64_t i = 0; i < kSamples; ++i) flat.push_back(b * 100 + i);
      offsets.push_back(static_cast<int64_t>(flat.size()));
    }
    if (odd >= 0) flat[kSamples / 2] = odd;
    ASSERT_TRUE(batches_->Set(epoch, std::move(flat), std::move(offsets), kSeed).ok());
  }

  // A worker as the engine makes it for one of its threads (the process
  // forked now), or for the consumer's (forked at its first batch).
  std::unique_ptr<KindWorker> NewWorker(WorkerPlace place = WorkerPlace::kWorkerThread) {
    return kind_->NewWorker(place, SampleCap{});
  }

  // Runs batch `batch` of `epoch` as an engine worker thread does; the
  // failed samples go into `outcome` (when given).
  Status Run(KindWorker* worker, int64_t epoch, int64_t batch, Descriptor* d,
             ItemOutcome* outcome = nullptr) {
    ItemOutcome mine;
    return worker->Run(epoch, batch, std::as_writable_bytes(std::span(*d)),
                       outcome != nullptr ? outcome : &mine);
  }

  // The payload words of a delivered batch. Gives the segment back, as the
  // engine's batch pool does.
  std::vector<int64_t> Take(Descriptor& d) {
    Result<SegmentView> view =
        workers_->View(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket]));
    EXPECT_TRUE(view.ok()) << view.status().message();
    if (!view.ok()) return {};
    const auto* bytes = static_cast<const std::byte*>(view->map->addr) + d[D::kMetaOffset];
    std::vector<int64_t> words(static_cast<size_t>(d[D::kMetaLength]) / sizeof(int64_t));
    std::memcpy(words.data(), bytes, words.size() * sizeof(int64_t));
    kind_->Recycle(std::as_writable_bytes(std::span(d)));
    return words;
  }

  // Batch `batch` of epoch 0 as the fake writes it, without `odd`.
  std::vector<int64_t> Expected(int64_t batch, int64_t odd = -1) {
    const int64_t seed = BatchSeed(kSeed, 0, batch);
    std::vector<int64_t> words;
    for (int64_t i = 0; i < kSamples; ++i) {
      if (!(batch == 0 && odd >= 0 && i == kSamples / 2))
        words.push_back(Payload(batch * 100 + i, seed));
    }
    return words;
  }

  static constexpr int64_t kBatches = 12;
  static constexpr int64_t kSamples = 5;
  int zygote_pid_ = -1;
  int notify_[2] = {-1, -1};
  std::shared_ptr<EpochBatches> batches_;
  std::shared_ptr<ProcessWorkers> workers_;
  std::unique_ptr<ProcessKind> kind_;
};

TEST_F(ProcessWorkersTest, BatchesFromSeveralThreadsComeBackWithTheirDescriptors) {
  SetEpoch(0);
  constexpr int kThreads = 3;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::unique_ptr<KindWorker> worker = NewWorker();
      for (int64_t b = t; b < kBatches; b += kThreads) {
        Descriptor d{};
        ItemOutcome outcome;
        Status st = Run(worker.get(), 0, b, &d, &outcome);
        ASSERT_TRUE(st.ok()) << st.message();
        EXPECT_EQ(outcome.samples, kSamples);
        EXPECT_TRUE(outcome.failures.empty());
        EXPECT_EQ(d[D::kMagic], protocol::kSegmentMagic);
        EXPECT_EQ(d[D::kEpoch], 0);
        EXPECT_EQ(d[D::kBatch], b);
        EXPECT_EQ(d[D::kSegmentSize], static_cast<int64_t>(protocol::kSegmentGrain));
        EXPECT_EQ(d[D::kMetaLength], kSamples * static_cast<int64_t>(sizeof(int64_t)));
        EXPECT_EQ(Take(d), Expected(b));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_TRUE(workers_->pids().empty());            // each worker ended its process
  EXPECT_EQ(workers_->segment_bytes().second, 0u);  // every segment given back
}

TEST_F(ProcessWorkersTest, PartsOfAnItemArePublishedInOrderUntilItsAttemptEnds) {
  Result<SegmentLease> lease = workers_->Acquire(4096);
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  const size_t grown = 2 * protocol::kSegmentGrain;
  workers_->Publish(3, 5, 0, *lease, grown, 4096, 100);
  workers_->Publish(3, 5, 2, *lease, grown, 9000, 50);  // out of order: not published
  workers_->Publish(3, 5, 1, *lease, grown, 8192, 60);
  EXPECT_FALSE(workers_->PartOf(3, 5, 2).has_value());
  EXPECT_FALSE(workers_->PartOf(3, 6, 0).has_value());  // another item
  std::optional<Descriptor> second = workers_->PartOf(3, 5, 1);
  ASSERT_TRUE(second.has_value());
  EXPECT_EQ((*second)[D::kSegment], lease->segment_id);
  EXPECT_EQ((*second)[D::kTicket], static_cast<int64_t>(lease->ticket));
  EXPECT_EQ((*second)[D::kSegmentSize], static_cast<int64_t>(grown));
  EXPECT_EQ((*second)[D::kMetaOffset], 8192);
  EXPECT_EQ((*second)[D::kMetaLength], 60);
  EXPECT_EQ((*second)[D::kBatch], 5);
  // The consumer's view maps what the worker grew the segment to.
  Result<SegmentView> view = workers_->View(lease->segment_id, lease->ticket);
  ASSERT_TRUE(view.ok()) << view.status().message();
  EXPECT_GE(view->map->size, grown);
  EXPECT_TRUE(workers_->Unpublish(3, 5));
  EXPECT_FALSE(workers_->PartOf(3, 5, 0).has_value());
  EXPECT_FALSE(workers_->Unpublish(3, 5));  // none left
  workers_->Release(lease->segment_id, lease->ticket);
}

// Processes that end with their epoch, taking a while to start and to end.
class EpochProcessesTest : public ProcessWorkersTest {
 protected:
  EpochProcessesTest() : ProcessWorkersTest("batch", false, kSlowMs) {}
  static constexpr int kSlowMs = 300;
};

TEST_F(EpochProcessesTest, AFreeSegmentGoesWhollyWhileNoProcessLives) {
  // Without persistent workers, between epochs nothing writes a segment
  // before the next iter(): one given back keeps neither its memory nor its
  // descriptor (an idle loader held 8 batches of both), and is made anew.
  Result<SegmentLease> lease = workers_->Acquire(4096);
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  EXPECT_GT(workers_->segment_bytes().first, 0u);
  workers_->Release(lease->segment_id, lease->ticket);
  EXPECT_EQ(workers_->segment_bytes().first, 0u);
  EXPECT_EQ(fcntl(lease->fd, F_GETFD), -1);  // closed
  Result<SegmentLease> again = workers_->Acquire(4096);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->segment_id, lease->segment_id);
  EXPECT_GE(fcntl(again->fd, F_GETFD), 0);
  EXPECT_TRUE(workers_->View(again->segment_id, again->ticket).ok());
  workers_->Release(again->segment_id, again->ticket);
}

TEST_F(EpochProcessesTest, AWorkerIsStartingUntilItsWorkerInitFnReturns) {
  // The tuner reads no window while a worker starts: its worker_init_fn
  // runs in its first item, and a pool half up reads low.
  SetEpoch(0);
  std::unique_ptr<KindWorker> worker = NewWorker();
  EXPECT_EQ(kind_->starting(), 0);  // greeted, idle
  Descriptor d{};
  Status ran = Internal("not run");
  std::thread runs([&] { ran = Run(worker.get(), 0, 0, &d); });
  const auto patience = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  int seen = 0;
  while (seen == 0 && std::chrono::steady_clock::now() < patience) {
    seen = kind_->starting();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  runs.join();
  ASSERT_TRUE(ran.ok()) << ran.message();
  EXPECT_EQ(Take(d), Expected(0));
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(kind_->starting(), 0);
}

TEST_F(EpochProcessesTest, AProcessEndedWithItsEpochIsSetUpTimeNotTheNextBatchs) {
  // The end (EXIT, the zygote's reap) comes inside the next epoch's first
  // item; as a start, it is no item's: the tuner read it as reads waiting.
  SetEpoch(0);
  std::unique_ptr<KindWorker> worker = NewWorker();
  Descriptor d{};
  ASSERT_TRUE(Run(worker.get(), 0, 0, &d).ok());
  EXPECT_EQ(Take(d), Expected(0));
  const int64_t before = worker->cost().setup_ns;
  Status next = Internal("not run");
  std::thread runs([&] { next = Run(worker.get(), 1, 0, &d); });  // waits for epoch 1's list
  const auto patience = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (worker->cost().setup_ns - before < int64_t{kSlowMs} * 1'000'000 &&
         std::chrono::steady_clock::now() < patience) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  SetEpoch(1);
  runs.join();
  ASSERT_TRUE(next.ok()) << next.message();
  Take(d);
  EXPECT_GE(worker->cost().setup_ns - before, int64_t{kSlowMs} * 1'000'000);
}

class ProcessShardsTest : public ProcessWorkersTest {
 protected:
  ProcessShardsTest() : ProcessWorkersTest("shard") {}

  // Item 0 of epoch 0, one shard, run by a worker whose thread may leave once
  // two parts are published; whether it yielded. The worker's process ends.
  bool RunAndLeave() {
    std::vector<int64_t> flat{kShard + 4}, offsets{0, 1};
    if (!batches_->Set(0, std::move(flat), std::move(offsets), kSeed).ok()) return false;
    std::unique_ptr<KindWorker> leaving = NewWorker();
    const std::function<bool()> may_leave = [&] { return workers_->PartOf(0, 0, 1).has_value(); };
    Descriptor d{};
    ItemOutcome outcome;
    outcome.may_leave = &may_leave;
    return Run(leaving.get(), 0, 0, &d, &outcome).ok() && outcome.yielded;
  }
};

// A worker whose thread may leave mid-shard asks its process to YIELD; the
// next worker continues the shard in the same segment after the parts made,
// which stay published. The shard comes whole, each part made once.
TEST_F(ProcessShardsTest, AShardYieldedAtAPartIsContinuedInItsSegmentByTheNextWorker) {
  std::unique_ptr<KindWorker> staying = NewWorker();
  ASSERT_TRUE(RunAndLeave());
  EXPECT_EQ(workers_->handed_over(), 1);
  std::optional<Descriptor> first = workers_->PartOf(0, 0, 0);
  ASSERT_TRUE(first.has_value());  // still there for the consumer
  const int64_t made = [&] {
    int64_t k = 0;
    while (workers_->PartOf(0, 0, k).has_value()) ++k;
    return k;
  }();
  EXPECT_GE(made, 2);
  EXPECT_LT(made, kParts);
  Descriptor d{};
  ItemOutcome rest;
  ASSERT_TRUE(Run(staying.get(), 0, 0, &d, &rest).ok());
  EXPECT_FALSE(rest.yielded);
  EXPECT_EQ(rest.samples, kParts);
  EXPECT_EQ(d[D::kSegment], (*first)[D::kSegment]);  // the same segment, the same use
  EXPECT_EQ(d[D::kTicket], (*first)[D::kTicket]);
  EXPECT_FALSE(workers_->PartOf(0, 0, 0).has_value());  // the item holds them now
  Result<SegmentView> view =
      workers_->View(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket]));
  ASSERT_TRUE(view.ok()) << view.status().message();
  const auto* base = static_cast<const int64_t*>(view->map->addr);
  const int64_t seed = BatchSeed(kSeed, 0, 0);
  for (int64_t k = 0; k < kParts; ++k) {
    const int64_t at = base[(d[D::kMetaOffset] / 8) + k];
    EXPECT_EQ(base[at / 8], Payload(4 * 100 + k, seed)) << k;
  }
  kind_->Recycle(std::as_writable_bytes(std::span(d)));
  EXPECT_EQ(workers_->segment_bytes().second, 0u);
}

// A process that dies in a shard after publishing parts is replaced by one
// that goes on after them, in the same segment; one that dies again before
// a new part fails the shard, named, its parts let go.
TEST_F(ProcessShardsTest, AShardWhoseProcessDiesGoesOnAfterItsPartsWhileEachDeathIsAfterNewOnes) {
  std::vector<int64_t> flat{kShard + kShardDies, kShard + kShardAlwaysDies}, offsets{0, 1, 2};
  ASSERT_TRUE(batches_->Set(0, std::move(flat), std::move(offsets), kSeed).ok());
  std::unique_ptr<KindWorker> worker = NewWorker();
  Descriptor d{};
  ItemOutcome outcome;
  ASSERT_TRUE(Run(worker.get(), 0, 0, &d, &outcome).ok());
  EXPECT_TRUE(outcome.failures.empty());
  EXPECT_EQ(outcome.samples, kParts);
  EXPECT_EQ(workers_->shard_deaths(), 1);
  {
    Result<SegmentView> view =
        workers_->View(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket]));
    ASSERT_TRUE(view.ok()) << view.status().message();
    const auto* base = static_cast<const int64_t*>(view->map->addr);
    const int64_t seed = BatchSeed(kSeed, 0, 0);
    for (int64_t k = 0; k < kParts; ++k) {  // each part once, the continued ones after the first
      const int64_t at = base[(d[D::kMetaOffset] / 8) + k];
      EXPECT_EQ(base[at / 8], Payload(kShardDies * 100 + k, seed)) << k;
    }
  }
  kind_->Recycle(std::as_writable_bytes(std::span(d)));

  ItemOutcome dead;
  ASSERT_TRUE(Run(worker.get(), 0, 1, &d, &dead).ok());
  ASSERT_EQ(dead.failures.size(), 1u);
  EXPECT_EQ(workers_->shard_deaths(), 2);  // gone on once after part kDiesAt, then failed
  EXPECT_NE(dead.failures[0].status.message().find("signal 15"), std::string::npos)
      << dead.failures[0].status.message();
  EXPECT_FALSE(workers_->PartOf(0, 1, 0).has_value());
  kind_->Recycle(std::as_writable_bytes(std::span(d)));
  EXPECT_EQ(workers_->segment_bytes().second, 0u);
}

TEST_F(ProcessShardsTest, AYieldedShardMadeElsewhereLetsItsSegmentGoAtTheLastHold) {
  ASSERT_TRUE(RunAndLeave());
  // The consumer holds part 0 when a remote slot's copy of the shard arrives.
  std::optional<Descriptor> first = workers_->PartOf(0, 0, 0);
  ASSERT_TRUE(first.has_value());
  const auto segment = static_cast<int>((*first)[D::kSegment]);
  const auto ticket = static_cast<uint64_t>((*first)[D::kTicket]);
  ASSERT_TRUE(workers_->Hold(segment, ticket).ok());
  EXPECT_TRUE(workers_->Forgo(0, 0));
  EXPECT_FALSE(workers_->Forgo(0, 0));  // nothing left to let go
  EXPECT_FALSE(workers_->PartOf(0, 0, 0).has_value());
  EXPECT_FALSE(workers_->Continue(0, 0).has_value());
  EXPECT_TRUE(workers_->View(segment, ticket).ok());  // the held part is still readable
  workers_->Unhold(segment, ticket);
  EXPECT_EQ(workers_->segment_bytes().second, 0u);  // back in the pool, not leased until close
}

// A shard whose epoch is abandoned while it is read (an endless one) stops
// at its next sample (DROP, DROPPED), unmade: its parts are let go, its
// segment goes back, and the same process makes the next shard whole.
TEST_F(ProcessShardsTest, AShardOfAnAbandonedEpochStopsAtItsNextSampleAndLetsItsSegmentGo) {
  std::vector<int64_t> flat{kShard + kShardEndless, kShard + 4}, offsets{0, 1, 2};
  ASSERT_TRUE(batches_->Set(0, std::move(flat), std::move(offsets), kSeed).ok());
  std::unique_ptr<KindWorker> worker = NewWorker();
  std::atomic<bool> abandoned{false};
  std::thread abandon([&] {  // once two parts are made
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!workers_->PartOf(0, 0, 1).has_value() && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    abandoned.store(true);
  });
  Descriptor d{};
  ItemOutcome outcome;
  outcome.abandoned = &abandoned;
  const Status st = Run(worker.get(), 0, 0, &d, &outcome);
  abandon.join();
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_TRUE(outcome.dropped);
  EXPECT_FALSE(outcome.yielded);
  EXPECT_TRUE(outcome.failures.empty());
  EXPECT_EQ(d, Descriptor{});  // nothing to deliver
  EXPECT_FALSE(workers_->PartOf(0, 0, 0).has_value());
  EXPECT_EQ(workers_->segment_bytes().second, 0u);
  const std::vector<int> pids = workers_->pids();
  ASSERT_EQ(pids.size(), 1u);

  ItemOutcome next;
  ASSERT_TRUE(Run(worker.get(), 0, 1, &d, &next).ok());
  EXPECT_FALSE(next.dropped);
  EXPECT_EQ(next.samples, kParts);
  EXPECT_EQ(workers_->pids(), pids);  // in sync with its parent: not replaced
  kind_->Recycle(std::as_writable_bytes(std::span(d)));
  EXPECT_EQ(workers_->segment_bytes().second, 0u);
}

// A shard handed over just as its epoch is abandoned is continued by nobody:
// the worker that claims it lets its continuation, parts and segment go.
TEST_F(ProcessShardsTest, AShardHandedOverInAnAbandonedEpochIsDroppedByTheNextWorker) {
  std::unique_ptr<KindWorker> staying = NewWorker();
  ASSERT_TRUE(RunAndLeave());
  ASSERT_TRUE(workers_->PartOf(0, 0, 0).has_value());
  const std::atomic<bool> abandoned{true};
  Descriptor d{};
  ItemOutcome outcome;
  outcome.abandoned = &abandoned;
  ASSERT_TRUE(Run(staying.get(), 0, 0, &d, &outcome).ok());
  EXPECT_TRUE(outcome.dropped);
  EXPECT_EQ(d, Descriptor{});
  EXPECT_FALSE(workers_->Continue(0, 0).has_value());
  EXPECT_FALSE(workers_->PartOf(0, 0, 0).has_value());
  EXPECT_EQ(workers_->segment_bytes().second, 0u);
}

TEST_F(ProcessWorkersTest, AHeldSegmentGoesBackToThePoolAtItsLastUnhold) {
  Result<SegmentLease> lease = workers_->Acquire(4096);
  ASSERT_TRUE(lease.ok()) << lease.status().message();
  ASSERT_TRUE(workers_->Hold(lease->segment_id, lease->ticket).ok());
  ASSERT_TRUE(workers_->Hold(lease->segment_id, lease->ticket).ok());
  workers_->Release(lease->segment_id, lease->ticket);  // delivered and dropped: held still
  EXPECT_GT(workers_->segment_bytes().second, 0u);
  EXPECT_FALSE(workers_->Hold(lease->segment_id, lease->ticket).ok());  // released: no new hold
  Result<SegmentLease> other = workers_->Acquire(4096);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->segment_id, lease->segment_id);  // not handed out while held
  workers_->Unhold(lease->segment_id, lease->ticket);
  EXPECT_TRUE(workers_->View(lease->segment_id, lease->ticket).ok());
  workers_->Unhold(lease->segment_id, lease->ticket);
  EXPECT_FALSE(workers_->View(lease->segment_id, lease->ticket).ok());  // back in the pool
  workers_->Release(other->segment_id, other->ticket);
  EXPECT_EQ(workers_->segment_bytes().second, 0u);
  EXPECT_FALSE(workers_->Hold(lease->segment_id, lease->ticket).ok());
}

TEST_F(ProcessWorkersTest, AWorkerThatDiesMidTaskIsNamedAndTheBatchReruns) {
  SetEpoch(0, kDies);
  std::vector<std::thread> threads;
  for (int64_t b : {0, 1}) {
    threads.emplace_back([&, b] {
      std::unique_ptr<KindWorker> worker = NewWorker();
      Descriptor d{};
      ItemOutcome outcome;
      Status st = Run(worker.get(), 0, b, &d, &outcome);
      ASSERT_TRUE(st.ok()) << st.message();
      EXPECT_EQ(Take(d), Expected(b, kDies));
      if (b != 0) {
        EXPECT_TRUE(outcome.failures.empty());
        return;
      }
      EXPECT_EQ(outcome.samples, kSamples - 1);
      ASSERT_EQ(outcome.failures.size(), 1u);
      const SampleFailure& f = outcome.failures[0];
      EXPECT_EQ(f.index, kDies);
      // A crash is the sample's fault (SIGKILL would not be).
      EXPECT_EQ(f.status.code(), StatusCode::kDataError);
      EXPECT_NE(f.status.message().find("killed by signal 15 (SIGTERM)"), std::string::npos)
          << f.status.message();
      EXPECT_NE(f.status.message().find("while loading sample " + std::to_string(kDies)),
                std::string::npos)
          << f.status.message();
      // Named with its worker; no exception to raise as its type.
      const auto* detail = dynamic_cast<const SampleErrorDetail*>(f.status.detail().get());
      ASSERT_NE(detail, nullptr);
      EXPECT_EQ(detail->index, kDies);
      EXPECT_GE(detail->worker, 0);
      EXPECT_TRUE(detail->exception.empty());
    });
  }
  for (auto& thread : threads) thread.join();
}

TEST_F(ProcessWorkersTest, ASampleThatRaisedCarriesItsWorkerTracebackAndPickledException) {
  SetEpoch(0, kRaises);
  std::unique_ptr<KindWorker> worker = NewWorker();
  Descriptor d{};
  ItemOutcome outcome;
  Status st = Run(worker.get(), 0, 0, &d, &outcome);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(Take(d), Expected(0, kRaises));
  EXPECT_EQ(outcome.samples, kSamples - 1);
  ASSERT_EQ(outcome.failures.size(), 1u);
  const SampleFailure& f = outcome.failures[0];
  EXPECT_EQ(f.index, kRaises);
  EXPECT_EQ(f.status.code(), StatusCode::kDataError);
  // The message has the reason and the traceback, not the pickle after them.
  EXPECT_EQ(f.status.message(),
            std::string(kReason) + "\n\nIn the worker:\n" + std::string(kTrace));
  const auto* detail = dynamic_cast<const SampleErrorDetail*>(f.status.detail().get());
  ASSERT_NE(detail, nullptr);
  EXPECT_EQ(detail->index, kRaises);
  EXPECT_EQ(detail->worker, 0);  // the first worker's id
  EXPECT_EQ(detail->traceback, kTrace);
  EXPECT_EQ(detail->exception, kPickled);
  EXPECT_EQ(detail->batch_ticket, 0u);
}

TEST_F(ProcessWorkersTest, ShutdownFromAnotherThreadCancelsWaitingTasks) {
  SetEpoch(0, kHangs);
  Status in_worker, in_batches;
  // One task waits for a worker that hangs on a sample, one for an epoch's
  // batches that never come.
  std::thread hung([&] {
    std::unique_ptr<KindWorker> worker = NewWorker(WorkerPlace::kConsumer);
    Descriptor d{};
    in_worker = Run(worker.get(), 0, 0, &d);
  });
  std::latch started(1);  // its process is up: Shutdown does not race its fork
  std::thread unset([&] {
    std::unique_ptr<KindWorker> worker = NewWorker();
    started.count_down();
    Descriptor d{};
    in_batches = Run(worker.get(), 1, 0, &d);
  });
  started.wait();
  char byte = 0;
  ASSERT_EQ(read(notify_[0], &byte, 1), 1);  // the worker is on the sample that hangs
  workers_->Shutdown();
  hung.join();
  unset.join();
  EXPECT_EQ(in_worker.code(), StatusCode::kCancelled) << in_worker.message();
  // Whether it was waiting yet or not, a shut-down loader cancels it.
  EXPECT_EQ(in_batches.code(), StatusCode::kCancelled) << in_batches.message();
  EXPECT_EQ(workers_->Acquire(1).status().code(), StatusCode::kCancelled);
}

TEST_F(ProcessWorkersTest, CloseMakesTheZygoteExit) {
  SetEpoch(0);
  std::thread user([&] {
    std::unique_ptr<KindWorker> worker = NewWorker(WorkerPlace::kConsumer);
    Descriptor d{};
    Status st = Run(worker.get(), 0, 3, &d);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(Take(d), Expected(3));
  });
  user.join();
  std::thread closer([&] { workers_->Close(); });
  closer.join();
  int status = 0;
  ASSERT_EQ(waitpid(zygote_pid_, &status, 0), zygote_pid_);
  zygote_pid_ = -1;
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_TRUE(workers_->shut_down());
}

// A peer that closes with our message unread (a worker that died after a
// YIELD or DROP was sent) resets the connection: read as the socket closed
// (a death, which the worker's rules handle), not as an error of its own.
TEST(WorkerMessageTest, APeerGoneWithAMessageUnreadIsASocketClosed) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair), 0);
  ASSERT_TRUE(SendMessage(pair[0], Tag::kDrop, {}).ok());
  ::close(pair[1]);  // gone, the DROP unread
  Result<Message> got = ReceiveMessage(pair[0]);
  ::close(pair[0]);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kCancelled) << got.status().message();
}

}  // namespace
}  // namespace stoker::python
