#include "process_workers.h"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>
#include <span>
#include <string_view>
#include <utility>

#include "core/clock.h"
#include "core/fd_registry.h"
#include "core/number_text.h"
#include "stoker/probe.h"
#include "stoker/rng.h"
#include "worker_message.h"

namespace stoker::python {
namespace {

using protocol::kMessages;
using protocol::Tag;

// How long a worker process may take to greet, and the zygote to answer.
constexpr std::chrono::seconds kStartLimit{60};
constexpr size_t kPage = 4096;
constexpr int kFreeKept = 8;  // free segments that keep their memory

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// One worker counted in `n` while this lives (ProcessWorkers::starting).
class Counted {
 public:
  explicit Counted(std::atomic<int>& n) : n_(n) { n_.fetch_add(1, std::memory_order_relaxed); }
  ~Counted() { n_.fetch_sub(1, std::memory_order_relaxed); }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;

 private:
  std::atomic<int>& n_;
};

// The descriptor of what a worker wrote in `lease`'s segment for batch `item`.
std::array<int64_t, kDescriptorWords> DescriptorOf(const SegmentLease& lease, int64_t size,
                                                   int64_t meta_off, int64_t meta_len,
                                                   int64_t epoch, int64_t item) {
  using D = protocol::ProcessDescriptor;
  std::array<int64_t, kDescriptorWords> d{};
  d[D::kMagic] = protocol::kSegmentMagic;
  d[D::kSegment] = lease.segment_id;
  d[D::kTicket] = static_cast<int64_t>(lease.ticket);
  d[D::kSegmentSize] = size;
  d[D::kMetaOffset] = meta_off;
  d[D::kMetaLength] = meta_len;
  d[D::kEpoch] = epoch;
  d[D::kBatch] = item;
  return d;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return std::to_string(sig) + (abbrev != nullptr ? std::string(" (SIG") + abbrev + ")" : "");
}

// The failure of a Python dataset's sample: `reason`, the worker's traceback
// after it; kUnavailable (never skipped) when it is not the sample's fault.
Status SampleFailureStatus(const std::string& reason, const std::string& trace,
                           bool not_the_samples_fault) {
  std::string text = reason;
  if (not_the_samples_fault) text += " (not the sample's fault: never skipped)";
  if (!trace.empty()) text += "\n\nIn the worker:\n" + trace;
  return not_the_samples_fault ? Unavailable(std::move(text)) : DataError(std::move(text));
}

// A FAIL message's parts: what failed, the worker's traceback (its text,
// split at the NUL) and the pickled exception that ends it (empty: none).
struct Failure {
  std::string reason, trace, exception;
};
Failure ReadFailure(const Message& m) {
  const int64_t bytes =
      m.words[m.tag == Tag::kSampleFail ? size_t{protocol::SampleFailWord::kExceptionBytes}
                                        : size_t{protocol::FailWord::kExceptionBytes}];
  std::string_view text = m.text;
  Failure f;
  if (bytes > 0 && static_cast<size_t>(bytes) <= text.size()) {
    const size_t at = text.size() - static_cast<size_t>(bytes);
    f.exception = std::string(text.substr(at));
    text = text.substr(0, at);
  }
  const size_t nul = std::min(text.find('\0'), text.size());
  f.reason = std::string(text.substr(0, nul));
  if (nul < text.size()) f.trace = std::string(text.substr(nul + 1));
  return f;
}

// How a worker process (worker id `worker`) that died mid-sample is
// reported: SIGKILL is the kernel's answer to memory (the OOM killer) or
// someone's kill, not the sample's fault; a crash or an exit in the
// sample's code is (no exception to raise as its type). `shard`: the index
// is a sharded stream's shard (named as such by NameShardFailures), no sample.
SampleFailure DeathCause(const std::string& what, int64_t index, int worker, bool killed,
                         bool shard) {
  auto detail = std::make_shared<SampleErrorDetail>();
  detail->index = index;
  detail->worker = worker;
  return FailedSample(
      std::move(detail),
      what + (shard ? " while reading it" : " while loading sample " + std::to_string(index)),
      killed);
}

}  // namespace

ProcessWorker::ProcessWorker(std::shared_ptr<ProcessWorkers> workers, const SampleCap& cap)
    : workers_(std::move(workers)), budget_bytes_(cap.budget_bytes) {}

size_t ProcessWorker::MemoryShare() const {
  // Each process may hold an equal share of what the batch segments leave of
  // the budget, so the processes and segments together stay within it. The
  // engine keeps its look-ahead within half the budget; segments past that are
  // batches the consumer keeps, which do not shrink the workers' half.
  if (budget_bytes_ == 0) return 0;
  const size_t segments = std::min(workers_->segment_bytes().first, budget_bytes_ / 2);
  const auto n = static_cast<size_t>(std::max<int64_t>(1, workers_->running()));
  return (budget_bytes_ - segments) / n;
}

ProcessWorker::~ProcessWorker() { Stop(); }

WorkerCost ProcessWorker::cost() const {
  // Its unique memory (copy-on-read growth shows there) and its share of the
  // loader's segments: summed over the workers, what they cost. Nothing
  // without a live, measured process.
  const size_t own = private_.load(std::memory_order_relaxed);
  return {.cpu_ns = cpu_ns_.load(std::memory_order_relaxed),
          .queue_ns = queue_ns_.load(std::memory_order_relaxed),
          .setup_ns = setup_ns_.load(std::memory_order_relaxed),
          .bytes = own == 0 ? 0 : own + workers_->segment_share(),
          .trimmable_bytes = own > baseline_.load(std::memory_order_relaxed)
                                 ? own - baseline_.load(std::memory_order_relaxed)
                                 : 0};
}

Status ProcessWorker::Serve(int64_t base_seed) {
  if (proc_ && proc_->base_seed && *proc_->base_seed != base_seed) Stop();
  STOKER_RETURN_IF_ERROR(Start());
  if (proc_->base_seed) return Status::Ok();
  const int64_t began = SteadyNanos();
  Status st = workers_->Init(*proc_, base_seed);
  setup_ns_.fetch_add(SteadyNanos() - began, std::memory_order_relaxed);
  if (!st.ok()) {
    proc_.reset();  // Init collected it
    proc_epoch_ = -1;
    return st;
  }
  proc_->base_seed = base_seed;
  return Status::Ok();
}

Status ProcessWorker::Start() {
  if (proc_) return Status::Ok();
  const int64_t began = SteadyNanos();
  Result<WorkerProcess> spawned = workers_->Spawn();
  setup_ns_.fetch_add(SteadyNanos() - began, std::memory_order_relaxed);
  STOKER_ASSIGN_OR_RETURN(WorkerProcess started, std::move(spawned));
  proc_ = std::move(started);
  proc_epoch_ = workers_->batches().last_set();
  proc_batches_ = 0;
  cpu_seen_ = queue_seen_ = 0;
  baseline_.store(0, std::memory_order_relaxed);
  return Status::Ok();
}

Status ProcessWorker::Attempt(int64_t epoch, int64_t batch, const std::vector<int64_t>& indices,
                              const std::string& keys, int64_t seed, int64_t base_seed,
                              const SegmentLease& lease, const ProcessWorkers::Continuation* resume,
                              Reply* reply, ItemOutcome* outcome) {
  STOKER_RETURN_IF_ERROR(Serve(base_seed));
  const size_t n = indices.size();
  const size_t keys_off = (protocol::kSegmentHeaderWords + n) * sizeof(int64_t);
  const size_t data_off = resume != nullptr ? static_cast<size_t>(resume->data_end)
                                            : RoundUp(keys_off + keys.size(), kPage);
  STOKER_ASSIGN_OR_RETURN(auto map, workers_->MapForWrite(lease, data_off));
  auto* words = static_cast<int64_t*>(map->addr);
  using H = protocol::SegmentWord;
  words[H::kMagic] = protocol::kSegmentMagic;
  words[H::kPosition] = -1;
  words[H::kSamples] = static_cast<int64_t>(n);
  words[H::kDataOffset] = static_cast<int64_t>(data_off);
  words[H::kSeed] = seed;
  words[H::kKeysBytes] = static_cast<int64_t>(keys.size());
  words[H::kResumeOffset] = resume != nullptr ? resume->resume_offset : 0;
  words[H::kResumeLength] = resume != nullptr ? resume->resume_length : 0;
  std::copy(indices.begin(), indices.end(), words + protocol::kSegmentHeaderWords);
  std::memcpy(static_cast<char*>(map->addr) + keys_off, keys.data(), keys.size());
  const int id = lease.segment_id;
  const bool known = std::find(proc_->known_segments.begin(), proc_->known_segments.end(), id) !=
                     proc_->known_segments.end();
  using T = protocol::TaskWord;
  protocol::Words<T> task{};
  task[T::kEpoch] = epoch;
  task[T::kBatch] = batch;
  task[T::kSegment] = id;
  task[T::kSegmentSize] = static_cast<int64_t>(map->size);
  reply->workers = workers_->running();
  task[T::kNumWorkers] = workers_->NumWorkersSeen();
  task[T::kMemoryLimit] = static_cast<int64_t>(MemoryShare());
  STOKER_RETURN_IF_ERROR(SendMessage(proc_->conn.get(), Tag::kTask, task, known ? -1 : lease.fd));
  if (!known) proc_->known_segments.push_back(id);
  // A sharded stream's item may stop at a part (YIELD) once this thread may
  // leave the pool, and at its next sample (DROP) once its epoch is
  // abandoned: asked before each message, and every kYieldPoll.
  const bool sharded = workers_->batches().sharded();
  bool may_yield = outcome->may_leave != nullptr && sharded;
  bool may_drop = outcome->abandoned != nullptr && sharded;
  int64_t drop_by_ns = 0;  // DROP sent: a process still in its sample then is killed
  while (true) {
    if (may_yield && (*outcome->may_leave)()) {
      STOKER_RETURN_IF_ERROR(SendMessage(proc_->conn.get(), Tag::kYield, {}));
      may_yield = false;
    }
    if (may_drop && outcome->Abandoned()) {
      STOKER_RETURN_IF_ERROR(SendMessage(proc_->conn.get(), Tag::kDrop, {}));
      may_drop = false;
      drop_by_ns = SteadyNanos() + std::chrono::nanoseconds(kDropGrace).count();
    }
    const bool poll = may_yield || may_drop || drop_by_ns > 0;
    Result<Message> got =
        poll ? ReceiveMessageWithin(proc_->conn.get(), kYieldPoll, [] { return false; })
             : ReceiveMessage(proc_->conn.get());
    if (poll && got.status().code() == StatusCode::kUnavailable) {  // none yet
      if (drop_by_ns > 0 && SteadyNanos() >= drop_by_ns) {
        // Stalled in a sample of an abandoned epoch (a read that never
        // ends): its item is dropped, and a fresh process serves the next.
        Stop(/*kill=*/true);
        reply->dropped = true;
        return Status::Ok();
      }
      continue;
    }
    STOKER_ASSIGN_OR_RETURN(Message m, std::move(got));
    if (m.tag == Tag::kDropped) {
      reply->dropped = true;
      return Status::Ok();
    }
    if (m.tag == Tag::kPart) {
      using W = protocol::PartWord;
      workers_->Publish(epoch, batch, m.words[W::kPart], lease,
                        static_cast<size_t>(m.words[W::kSegmentSize]), m.words[W::kMetaOffset],
                        m.words[W::kMetaLength]);
      continue;
    }
    if (m.tag == Tag::kYielded) {
      using Y = protocol::YieldedWord;
      reply->size = m.words[Y::kSegmentSize];
      reply->yielded = ProcessWorkers::Continuation{
          lease, m.words[Y::kResumeOffset], m.words[Y::kResumeLength], m.words[Y::kDataEnd]};
      return Status::Ok();
    }
    using F = protocol::SampleFailWord;
    if (m.tag == Tag::kTaskFail || m.tag == Tag::kSampleFail) {
      Failure failure = ReadFailure(m);
      auto detail = std::make_shared<SampleErrorDetail>();
      detail->worker = proc_->id;
      detail->exception = std::move(failure.exception);
      if (m.tag == Tag::kTaskFail) {
        if (m.words[protocol::FailWord::kRefused] != 0) {
          // The machine's, not the data's: a plain ResourceError, never skipped.
          return ResourceExhausted(failure.trace.empty()
                                       ? failure.reason
                                       : failure.reason + "\n\nIn the worker:\n" + failure.trace);
        }
        return BatchFailureStatus(failure.reason, std::move(failure.trace), detail);
      }
      detail->index = m.words[F::kIndex];
      detail->traceback = std::move(failure.trace);
      outcome->failures.push_back(
          FailedSample(std::move(detail), failure.reason, m.words[F::kNotTheSamplesFault] != 0));
      continue;
    }
    if (m.tag == Tag::kOver) {
      using O = protocol::OverWord;
      reply->over_samples = m.words[O::kSamples];
      reply->over_bytes = m.words[O::kPrivateBytes];
      return Status::Ok();
    }
    if (m.tag != Tag::kDone) {
      return Internal(std::string("a worker sent ") + kMessages[m.tag].tag + " instead of DONE");
    }
    using D = protocol::DoneWord;
    reply->samples = m.words[D::kSamples];
    reply->size = m.words[D::kSegmentSize];
    reply->meta_off = m.words[D::kMetaOffset];
    reply->meta_len = m.words[D::kMetaLength];
    const int64_t cpu = m.words[D::kCpuNs], queue = m.words[D::kRunDelayNs];
    cpu_ns_.fetch_add(cpu - cpu_seen_, std::memory_order_relaxed);
    queue_ns_.fetch_add(queue - queue_seen_, std::memory_order_relaxed);
    cpu_seen_ = cpu;
    queue_seen_ = queue;
    if (const int64_t own = m.words[D::kPrivateBytes]; own > 0) {
      private_.store(static_cast<size_t>(own), std::memory_order_relaxed);
      size_t none = 0;
      baseline_.compare_exchange_strong(none, static_cast<size_t>(own));
    }
    return Status::Ok();
  }
}

Result<ProcessWorkers::Continuation> ProcessWorker::ResumeAfterParts(
    const std::vector<ProcessWorkers::Descriptor>& parts, const SegmentLease& lease) {
  using D = protocol::ProcessDescriptor;
  int64_t end = 0;  // each part's meta follows its arrays
  for (const auto& d : parts) end = std::max(end, d[D::kMetaOffset] + d[D::kMetaLength]);
  const size_t at = RoundUp(static_cast<size_t>(end), protocol::kDataAlign);
  const size_t bytes = (1 + 2 * parts.size()) * sizeof(int64_t);
  STOKER_ASSIGN_OR_RETURN(auto map, workers_->MapForWrite(lease, at + bytes));
  auto* words = reinterpret_cast<int64_t*>(static_cast<char*>(map->addr) + at);
  words[0] = static_cast<int64_t>(parts.size());
  for (size_t k = 0; k < parts.size(); ++k) {
    words[1 + 2 * k] = parts[k][D::kMetaOffset];
    words[2 + 2 * k] = parts[k][D::kMetaLength];
  }
  return ProcessWorkers::Continuation{lease, static_cast<int64_t>(at), static_cast<int64_t>(bytes),
                                      static_cast<int64_t>(at + bytes)};
}

Status ProcessWorker::RunInSegment(int64_t epoch, int64_t batch, std::vector<int64_t> indices,
                                   const std::string& keys, int64_t seed, int64_t base_seed,
                                   SegmentLease* lease, size_t header,
                                   const ProcessWorkers::Continuation* resume, Reply* reply,
                                   ItemOutcome* outcome) {
  int deaths_outside = 0;
  // A shard's process died after new parts: the next attempt continues after
  // them (`next`), as the current one does (`current`); the parts it had then.
  std::optional<ProcessWorkers::Continuation> next, current;
  size_t parts_then = resume != nullptr ? workers_->PartsOf(epoch, batch).size() : 0;
  for (bool again = false;; again = true) {
    if (again) {
      current = std::exchange(next, std::nullopt);
      resume = current ? &*current : nullptr;
      if (workers_->batches().sharded() && outcome->Abandoned()) {  // nobody wants the rest
        *reply = Reply{};
        reply->dropped = true;
        return Status::Ok();
      }
    }
    if (workers_->shut_down()) return Cancelled("the loader was closed");
    // Any other attempt after one that published parts writes a fresh segment:
    // the consumer may hold those parts, which views of the old one must keep.
    if (again && !current && workers_->Unpublish(epoch, batch)) {
      workers_->Release(lease->segment_id, lease->ticket);
      STOKER_ASSIGN_OR_RETURN(*lease, workers_->Acquire(header));
    }
    const size_t reported = outcome->failures.size();
    *reply = Reply{};
    Status st =
        Attempt(epoch, batch, indices, keys, seed, base_seed, *lease, resume, reply, outcome);
    if (st.ok() && reply->over_bytes > 0) {
      // Over its share of the memory budget: a fresh process reruns the
      // batch, unless this one was fresh (the batch alone does not fit).
      outcome->failures.resize(reported);
      if (proc_batches_ == 0) {
        // Fewer workers give each a larger share: where the tuner sizes the
        // pool, this one leaves and another reruns the batch whole (a
        // shard's parts may be delivered already: it cannot start over).
        const bool tuned = outcome->may_shed != nullptr;
        if (tuned && !workers_->batches().sharded() &&
            (*outcome->may_shed)(OverShareReason(epoch, batch, indices.size(), *reply))) {
          Stop();
          reply->shed = true;
          return Status::Ok();
        }
        if (tuned && workers_->running() < reply->workers) {  // another left: a larger share
          Stop();
          STOKER_RETURN_IF_ERROR(Start());
          continue;
        }
        return OverShare(epoch, batch, indices.size(), *reply, tuned);
      }
      Stop();
      STOKER_RETURN_IF_ERROR(Start());
      continue;
    }
    if (st.ok()) {
      ++proc_batches_;
      return st;
    }
    if (st.code() != StatusCode::kCancelled || !proc_) return st;
    // The process died mid-task: blame the sample it was on and run the rest
    // in a fresh process, which reports the others' failures again.
    outcome->failures.resize(reported);
    const int pid = proc_->pid, id = proc_->id;
    const ProcessWorkers::Ending ending = workers_->Reap(*proc_);
    proc_.reset();
    if (workers_->shut_down()) return Cancelled("the loader was closed");
    STOKER_ASSIGN_OR_RETURN(
        auto map, workers_->MapForWrite(*lease, protocol::kSegmentHeaderWords * sizeof(int64_t)));
    const int64_t position =
        static_cast<const int64_t*>(map->addr)[protocol::SegmentWord::kPosition];
    const std::string what = "worker process " + std::to_string(pid) + " " + ending.how;
    if (position == 0 && workers_->batches().sharded()) {
      // A shard: a fresh process goes on after the parts published, while
      // each death comes after new ones (a sample that kills every reader
      // does not); its samples are read again from there.
      std::vector<ProcessWorkers::Descriptor> parts = workers_->PartsOf(epoch, batch);
      if (parts.size() > parts_then) {
        STOKER_ASSIGN_OR_RETURN(next, ResumeAfterParts(parts, *lease));
        parts_then = parts.size();
        workers_->CountShardDeath();
        continue;
      }
    }
    if (position >= 0 && position < static_cast<int64_t>(indices.size())) {
      const int64_t index = indices[static_cast<size_t>(position)];
      outcome->failures.push_back(
          DeathCause(what, index, id, ending.killed, workers_->batches().sharded()));
      indices.erase(indices.begin() + position);
      if (indices.empty()) return Status::Ok();  // every sample went down with a worker
      continue;
    }
    if (++deaths_outside >= 2) {
      return Internal(what + " outside any sample (collating or writing batch " +
                      std::to_string(batch) + "), twice");
    }
  }
}

Status ProcessWorker::Run(int64_t epoch, int64_t item, std::span<std::byte> out,
                          ItemOutcome* outcome) {
  // A yielded item continues in its segment, after the parts it has; one
  // that fails before it runs lets them go.
  const std::optional<ProcessWorkers::Continuation> resume = workers_->Continue(epoch, item);
  const auto unrun = [&](Status st) {
    if (resume) workers_->LetGo(epoch, item, *resume);
    return st;
  };
  // A shard of an abandoned epoch (one handed over just as its epoch was
  // abandoned) is read no further: whatever it holds goes back.
  EpochBatches& lists = workers_->batches();
  if (lists.sharded() && outcome->Abandoned()) {
    outcome->dropped = true;
    return unrun(Status::Ok());
  }
  // The process starts while the batch list may still be on its way (a loader
  // claims its first tasks when made, the list comes with iter()).
  if (workers_->shut_down()) return unrun(Cancelled("the loader was closed"));
  // Without persistent workers, a process ends with its epoch: one waiting
  // for the next epoch's list (made at the next iter()) lets its memory go,
  // whether or not it ran a batch of the epoch it was started in.
  const int64_t serves = proc_epoch_ >= 0 ? proc_epoch_ : lists.first_set();
  if (!workers_->persistent() && proc_ && serves >= 0 && serves != epoch && !lists.Has(epoch)) {
    Stop();
  } else if (Status st = Start(); !st.ok()) {
    return unrun(std::move(st));
  }
  Result<EpochBatches::Batch> listed = lists.Get(epoch, item);
  if (!listed.ok()) return unrun(listed.status());
  EpochBatches::Batch& got = *listed;
  if (Status st = Serve(got.base_seed); !st.ok()) return unrun(std::move(st));
  proc_epoch_ = epoch;
  std::vector<int64_t> indices = std::move(got.indices);
  const size_t header = RoundUp(
      (protocol::kSegmentHeaderWords + indices.size()) * sizeof(int64_t) + got.keys.size(), kPage);
  SegmentLease lease;
  if (resume) {
    lease = resume->lease;
  } else {
    STOKER_ASSIGN_OR_RETURN(lease, workers_->Acquire(header));
  }
  Reply reply;
  Status st = RunInSegment(epoch, item, std::move(indices), got.keys, got.seed, got.base_seed,
                           &lease, header, resume ? &*resume : nullptr, &reply, outcome);
  lists.NameShardFailures(&outcome->failures);
  // Its epoch was abandoned: stopped (DROPPED), or yielded just then. Its
  // parts and segment go back (the segment at the consumer's last Unhold).
  if (st.ok() && (reply.dropped || (reply.yielded && outcome->Abandoned()))) {
    workers_->Unpublish(epoch, item);
    workers_->Release(lease.segment_id, lease.ticket);
    outcome->failures.clear();
    outcome->dropped = true;
    return Status::Ok();
  }
  if (st.ok() && reply.yielded) {  // its parts stay published for the consumer
    if (reply.size > 0) {
      workers_->SetSize(lease, static_cast<size_t>(reply.size),
                        static_cast<size_t>(reply.yielded->data_end));
    }
    workers_->Yielded(epoch, item, *reply.yielded);
    outcome->yielded = true;
    return Status::Ok();
  }
  if (st.ok() && reply.shed) {  // run again, whole, by another worker
    workers_->Unpublish(epoch, item);
    workers_->Release(lease.segment_id, lease.ticket);
    outcome->failures.clear();
    outcome->yielded = true;
    return Status::Ok();
  }
  workers_->Unpublish(epoch, item);  // the item itself holds them now, or failed
  if (!st.ok()) {
    workers_->Release(lease.segment_id, lease.ticket);
    return st;
  }
  if (reply.size > 0) {
    workers_->SetSize(lease, static_cast<size_t>(reply.size),
                      static_cast<size_t>(reply.meta_off + reply.meta_len));
  }
  const auto d = DescriptorOf(lease, reply.size, reply.meta_off, reply.meta_len, epoch, item);
  std::memcpy(out.data(), d.data(), sizeof d);
  outcome->label = item;
  outcome->samples = reply.samples;
  return Status::Ok();
}

std::string ProcessWorker::OverShareReason(int64_t epoch, int64_t batch, size_t samples,
                                           const Reply& reply) const {
  const int64_t workers = std::max<int64_t>(1, workers_->running());
  return "batch " + std::to_string(batch) + " of epoch " + std::to_string(epoch) +
         " grew a fresh worker process to " + FormatBytes(static_cast<uint64_t>(reply.over_bytes)) +
         " of unique memory after " + std::to_string(reply.over_samples) + " of its " +
         std::to_string(samples) + (samples == 1 ? " sample" : " samples") +
         ", past its share of the memory budget (" + FormatBytes(MemoryShare()) +
         ": memory_budget_bytes " + FormatBytes(budget_bytes_) +
         ", less the batch segments, up to half of it, over " + std::to_string(workers) +
         (workers == 1 ? " worker" : " workers") + " running)";
}

Status ProcessWorker::OverShare(int64_t epoch, int64_t batch, size_t samples, const Reply& reply,
                                bool tuned) const {
  // Fewer samples a batch help only where a batch has more than one.
  const bool batched = samples > 1;
  return ResourceExhausted(
      OverShareReason(epoch, batch, samples, reply) +
      (tuned ? std::string("; one worker alone does not fit: raise memory_budget_bytes") +
                   (batched ? ", or lower batch_size" : "")
             : std::string("; raise memory_budget_bytes, or lower ") +
                   (batched ? "batch_size or num_workers" : "num_workers")));
}

void ProcessWorker::Stop(bool kill) {
  if (!proc_) return;
  // Its end (the exit, the zygote's reap) is no item's, as its start is not.
  const int64_t began = SteadyNanos();
  if (kill) {
    ::kill(proc_->pid, SIGKILL);
  } else {
    (void)SendMessage(proc_->conn.get(), Tag::kExit, {});
  }
  workers_->Reap(*proc_);
  setup_ns_.fetch_add(SteadyNanos() - began, std::memory_order_relaxed);
  proc_.reset();
  proc_epoch_ = -1;
  private_.store(0, std::memory_order_relaxed);
}

SampleFailure FailedSample(std::shared_ptr<SampleErrorDetail> detail, const std::string& reason,
                           bool not_the_samples_fault) {
  Status status = SampleFailureStatus(reason, detail->traceback, not_the_samples_fault);
  SampleFailure failure{detail->index, detail->key, std::move(status)};
  if (!not_the_samples_fault) failure.status = failure.status.WithDetail(std::move(detail));
  return failure;
}

Status BatchFailureStatus(const std::string& reason, std::string trace,
                          std::shared_ptr<SampleErrorDetail> detail) {
  Status status = DataError(trace.empty() ? reason : reason + "\n\nIn the worker:\n" + trace);
  detail->index = SampleErrorDetail::kNoSample;
  detail->traceback = std::move(trace);
  return status.WithDetail(std::move(detail));
}

Mapping::~Mapping() {
  pinned_.reset();  // unregistered before it is unmapped
  if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
}

Result<bool> Mapping::Pin(const std::shared_ptr<const CudaRuntime>& cuda) {
  MutexLock lock(pin_mu_);
  if (pinned_ != nullptr) return false;
  STOKER_ASSIGN_OR_RETURN(pinned_, HostRegistration::Make(cuda, addr, size, "a batch segment"));
  return true;
}

// ProcessWorkers

ProcessWorkers::ProcessWorkers(int zygote_fd, int zygote_pid, std::shared_ptr<EpochBatches> batches,
                               bool persistent)
    : batches_(std::move(batches)),
      persistent_(persistent),
      zygote_pid_(zygote_pid),
      owner_pid_(getpid()),
      zygote_(zygote_fd) {
  RegisterFd(zygote_fd);
}

bool ProcessWorkers::ForeignProcess() const { return getpid() != owner_pid_; }

ProcessWorkers::~ProcessWorkers() {
  if (ForeignProcess()) {  // leave the parent's descriptors alone (their numbers may be reused)
    (void)zygote_.release();
    for (auto& s : segments_) (void)s->fd.release();
    return;
  }
  Close();
  MutexLock lock(mu_);
  for (auto& s : segments_) DropLocked(*s);
}

int64_t ProcessWorkers::NumWorkersSeen() const {
  MutexLock lock(mu_);
  int64_t span = 0;  // the highest id in use, plus one
  for (size_t id = 0; id < ids_in_use_.size(); ++id) {
    if (ids_in_use_[id]) span = static_cast<int64_t>(id) + 1;
  }
  return std::max(running(), span);
}

Result<WorkerProcess> ProcessWorkers::Spawn() {
  const Counted starting(starting_);
  int id = 0;
  {
    MutexLock lock(mu_);
    if (shutdown_) return Cancelled("the loader was closed");
    while (id < static_cast<int>(ids_in_use_.size()) && ids_in_use_[static_cast<size_t>(id)]) ++id;
    if (id == static_cast<int>(ids_in_use_.size())) ids_in_use_.push_back(false);
    ids_in_use_[static_cast<size_t>(id)] = true;
  }
  auto give_back_id = [&] {
    MutexLock lock(mu_);
    ids_in_use_[static_cast<size_t>(id)] = false;
  };
  Message forked;
  {
    protocol::Words<protocol::ForkWord> fork{};
    fork[protocol::ForkWord::kWorkerId] = id;
    fork[protocol::ForkWord::kNumWorkers] = NumWorkersSeen();  // this id counted
    Result<Message> r = AskZygote(Tag::kFork, fork, true);
    if (!r.ok()) {
      give_back_id();
      if (shut_down()) return Cancelled("the loader was closed");
      return Unavailable("the worker fork server (pid " + std::to_string(zygote_pid_) +
                         ") is gone: " + r.status().message());
    }
    forked = std::move(*r);
  }
  if (forked.tag != Tag::kForked || !forked.fd.valid()) {
    give_back_id();
    return Unavailable("the worker fork server could not start a worker: " + forked.text);
  }
  WorkerProcess w;
  w.pid = static_cast<int>(forked.words[protocol::ForkedWord::kPid]);
  w.id = id;
  w.conn = std::move(forked.fd);
  RegisterFd(w.conn.get());
  {
    MutexLock lock(mu_);
    live_pids_.push_back(w.pid);
    if (shutdown_) kill(w.pid, SIGKILL);  // Shutdown ran while it was forked
  }
  // A worker that never greets (its threads refused under a pids limit) is
  // killed after kStartLimit: never a hang.
  Result<Message> hello =
      ReceiveMessageWithin(w.conn.get(), kStartLimit, [this] { return shut_down(); });
  if (hello.ok() && hello->tag == Tag::kHello) return w;
  if (shut_down()) {  // Shutdown killed it, or woke the wait
    kill(w.pid, SIGKILL);
    Reap(w);
    return Cancelled("the loader was closed");
  }
  const std::string named = "worker " + std::to_string(id) + " (pid " + std::to_string(w.pid) + ")";
  if (!hello.ok() && hello.status().code() != StatusCode::kCancelled) {
    kill(w.pid, SIGKILL);
    Reap(w);
    return Unavailable(named + " did not start: " + hello.status().message() +
                       " (is a limit on processes or threads, e.g. a pids cgroup, refusing "
                       "its threads?)");
  }
  if (!hello.ok())
    return Internal(named + " could not start: it exited before its greeting: " + Reap(w).how);
  kill(w.pid, SIGKILL);
  Reap(w);
  return Internal(named + " could not start: it sent " + kMessages[hello->tag].tag +
                  " instead of HELLO");
}

Status ProcessWorkers::Init(WorkerProcess& w, int64_t base_seed) {
  const Counted starting(starting_);
  const std::string named =
      "worker " + std::to_string(w.id) + " (pid " + std::to_string(w.pid) + ")";
  protocol::Words<protocol::InitWord> init{};
  init[protocol::InitWord::kBaseSeed] = base_seed;
  // A worker_init_fn that hangs is killed after kStartLimit: never a hang.
  Result<Message> done = [&]() -> Result<Message> {
    STOKER_RETURN_IF_ERROR(SendMessage(w.conn.get(), Tag::kInit, init));
    return ReceiveMessageWithin(w.conn.get(), kStartLimit, [this] { return shut_down(); });
  }();
  if (done.ok() && done->tag == Tag::kInitDone) return Status::Ok();
  if (done.ok() && done->tag == Tag::kInitFail) {
    Reap(w);  // it exits after saying so
    // Raised as worker_init_fn's own exception type, as torch re-raises it.
    Failure failure = ReadFailure(*done);
    auto detail = std::make_shared<SampleErrorDetail>();
    detail->index = SampleErrorDetail::kNoSample;
    detail->worker = w.id;
    detail->exception = std::move(failure.exception);
    detail->traceback = failure.trace;
    std::string text = named + " could not start: worker_init_fn raised " + failure.reason;
    if (!failure.trace.empty()) text += "\n\nIn the worker:\n" + failure.trace;
    return Internal(std::move(text)).WithDetail(std::move(detail));
  }
  kill(w.pid, SIGKILL);
  const Ending ending = Reap(w);
  if (shut_down()) return Cancelled("the loader was closed");
  if (!done.ok() && done.status().code() == StatusCode::kCancelled)
    return Internal(named + " could not start: it exited in worker_init_fn: " + ending.how);
  if (!done.ok()) {  // not a refused resource: the user's worker_init_fn did not return
    return Internal(named +
                    " could not start: worker_init_fn did not return: " + done.status().message());
  }
  return Internal(named + " could not start: it sent " + kMessages[done->tag].tag +
                  " instead of INITDONE");
}

Result<Message> ProcessWorkers::AskZygote(protocol::Tag::Index tag, std::span<const int64_t> words,
                                          bool cancellable) {
  MutexLock lock(zygote_mu_);
  // The replies to requests whose wait close() cut short come first: each
  // read and dropped (a worker forked for nobody killed, its socket closed),
  // so that this request gets its own reply, not one of theirs.
  for (; unanswered_ > 0; --unanswered_) {
    Result<Message> late = ReceiveMessageWithin(zygote_.get(), kStartLimit, [] { return false; });
    if (!late.ok()) {
      kill(zygote_pid_, SIGKILL);
      zygote_.reset();
      unanswered_ = 0;
      return late.status();
    }
    if (late->tag == Tag::kForked)
      kill(static_cast<pid_t>(late->words[protocol::ForkedWord::kPid]), SIGKILL);
  }
  STOKER_RETURN_IF_ERROR(SendMessage(zygote_.get(), tag, words));
  Result<Message> r = ReceiveMessageWithin(
      zygote_.get(), kStartLimit, [this, cancellable] { return cancellable && shut_down(); });
  if (!r.ok() && r.status().code() == StatusCode::kCancelled && zygote_.valid() && shut_down()) {
    ++unanswered_;  // its reply is still to come
  } else if (!r.ok()) {
    // Stuck, or out of step: its replies can no longer be matched to requests.
    kill(zygote_pid_, SIGKILL);
    zygote_.reset();
  }
  return r;
}

namespace {

// Said of a worker SIGBUS killed: a page of a shared mapping had no room.
// The segments have theirs from the start, so it is most likely a tensor
// torch placed in /dev/shm (every tensor default_collate makes in a worker).
std::string ShmHint() {
  const std::string shm = ProbeOptions().shm_path;
  std::string room;
  struct statvfs st;
  if (::statvfs(shm.c_str(), &st) == 0) {
    room = ", " + FormatBytes(uint64_t{st.f_bavail} * st.f_frsize) + " free of " +
           FormatBytes(uint64_t{st.f_blocks} * st.f_frsize);
  }
  return " (perhaps for want of room in " + shm + room +
         ": torch places there the tensors a worker makes for sharing, default_collate's "
         "among them, also called from a collate_fn; docker run --shm-size enlarges it)";
}

}  // namespace

ProcessWorkers::Ending ProcessWorkers::Reap(const WorkerProcess& worker) {
  {
    MutexLock lock(mu_);
    std::erase(live_pids_, worker.pid);
    if (worker.id >= 0 && worker.id < static_cast<int>(ids_in_use_.size())) {
      ids_in_use_[static_cast<size_t>(worker.id)] = false;
    }
    if (FreeKeptLocked() == 0) {
      for (auto& s : segments_) {
        if (!s->busy) DropLocked(*s);
      }
    }
  }
  UnregisterFd(worker.conn.get());
  protocol::Words<protocol::ReapWord> reap{};
  reap[protocol::ReapWord::kPid] = worker.pid;
  Result<Message> r = AskZygote(Tag::kReap, reap, false);
  if (!r.ok() || r->tag != Tag::kReaped) return {"ended (cause unknown)", false};
  const int64_t value = r->words[protocol::ReapedWord::kValue];
  if (r->words[protocol::ReapedWord::kSignalled] == 0) {
    return {"exited with code " + std::to_string(value), false};
  }
  std::string how = "was killed by signal " + SignalName(static_cast<int>(value));
  if (value == SIGKILL) how += ", perhaps by the kernel for lack of memory";
  if (value == SIGBUS) how += ShmHint();
  return {how, value == SIGKILL};
}

ProcessWorkers::Segment* ProcessWorkers::FindLocked(int id) {
  if (id < 0 || id >= static_cast<int>(segments_.size())) return nullptr;
  return segments_[static_cast<size_t>(id)].get();
}

ProcessWorkers::Segment* ProcessWorkers::LeasedLocked(const SegmentLease& lease) {
  Segment* s = FindLocked(lease.segment_id);
  return s != nullptr && s->ticket == lease.ticket ? s : nullptr;
}

Result<std::shared_ptr<Mapping>> ProcessWorkers::MapLocked(Segment& s, size_t bytes) {
  if (s.size < bytes) {
    const size_t size = std::max(RoundUp(bytes, protocol::kSegmentGrain), protocol::kSegmentGrain);
    if (ftruncate(s.fd.get(), static_cast<off_t>(size)) != 0) {
      return ErrnoError("growing a shared-memory segment to " + std::to_string(size) + " bytes",
                        errno);
    }
    // Reserve the pages now: an error here, not SIGBUS on a later write.
    if (const int err = posix_fallocate(s.fd.get(), 0, static_cast<off_t>(size)); err != 0) {
      return ErrnoError("reserving " + std::to_string(size) + " bytes of shared memory", err);
    }
    s.size = size;
  }
  if (s.map == nullptr || s.map->size != s.size) {
    void* addr = mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_SHARED, s.fd.get(), 0);
    if (addr == MAP_FAILED) return ErrnoError("mapping a shared-memory segment", errno);
    s.map = std::make_shared<Mapping>(addr, s.size);
  }
  return s.map;
}

Result<SegmentLease> ProcessWorkers::Acquire(size_t bytes) {
  MutexLock lock(mu_);
  if (shutdown_) return Cancelled("the loader was closed");
  Segment* pick = nullptr;
  for (auto& s : segments_) {
    if (!s->busy && (pick == nullptr || s->size > pick->size)) pick = s.get();
  }
  if (pick == nullptr) {
    auto s = std::make_unique<Segment>();
    s->id = static_cast<int>(segments_.size());
    segments_.push_back(std::move(s));
    pick = segments_.back().get();
  }
  if (!pick->fd.valid()) {  // new, or dropped while no process lived (FreeKeptLocked)
    const int fd = memfd_create("stoker-batch", MFD_CLOEXEC);
    if (fd < 0) return ErrnoError("creating a shared-memory segment (memfd_create)", errno);
    pick->fd.reset(fd);
    RegisterFd(fd);
  }
  STOKER_RETURN_IF_ERROR(MapLocked(*pick, bytes).status());
  pick->busy = true;
  pick->used = 0;
  pick->ticket += 1;
  return SegmentLease{pick->id, pick->fd.get(), pick->ticket};
}

void ProcessWorkers::Publish(int64_t epoch, int64_t item, int64_t part, const SegmentLease& lease,
                             size_t size, int64_t meta_off, int64_t meta_len) {
  // The consumer's view maps what the worker grew; each part's meta follows its arrays.
  SetSize(lease, size, static_cast<size_t>(meta_off + meta_len));
  MutexLock lock(parts_mu_);
  std::vector<Descriptor>& parts = parts_[{epoch, item}];
  // Parts come in order; a number out of it (a confused worker) publishes nothing.
  if (part != static_cast<int64_t>(parts.size())) return;
  parts.push_back(DescriptorOf(lease, static_cast<int64_t>(size), meta_off, meta_len, epoch, item));
}

void ProcessWorkers::Yielded(int64_t epoch, int64_t item, const Continuation& c) {
  handed_over_.fetch_add(1, std::memory_order_relaxed);
  MutexLock lock(parts_mu_);
  continuations_[{epoch, item}] = c;
}

std::optional<ProcessWorkers::Continuation> ProcessWorkers::Continue(int64_t epoch, int64_t item) {
  MutexLock lock(parts_mu_);
  auto it = continuations_.find({epoch, item});
  if (it == continuations_.end()) return std::nullopt;
  Continuation c = it->second;
  continuations_.erase(it);
  return c;
}

bool ProcessWorkers::Forgo(int64_t epoch, int64_t item) {
  const std::optional<Continuation> c = Continue(epoch, item);
  if (!c) return false;
  LetGo(epoch, item, *c);
  return true;
}

void ProcessWorkers::LetGo(int64_t epoch, int64_t item, const Continuation& c) {
  Unpublish(epoch, item);
  Release(c.lease.segment_id, c.lease.ticket);  // at the last Unhold, if the consumer holds parts
}

bool ProcessWorkers::Unpublish(int64_t epoch, int64_t item) {
  MutexLock lock(parts_mu_);
  return parts_.erase({epoch, item}) > 0;
}

std::vector<ProcessWorkers::Descriptor> ProcessWorkers::PartsOf(int64_t epoch, int64_t item) const {
  MutexLock lock(parts_mu_);
  auto it = parts_.find({epoch, item});
  return it == parts_.end() ? std::vector<Descriptor>{} : it->second;
}

std::optional<ProcessWorkers::Descriptor> ProcessWorkers::PartOf(int64_t epoch, int64_t item,
                                                                 int64_t part) const {
  MutexLock lock(parts_mu_);
  auto it = parts_.find({epoch, item});
  if (it == parts_.end() || part < 0 || part >= static_cast<int64_t>(it->second.size())) {
    return std::nullopt;
  }
  return it->second[static_cast<size_t>(part)];
}

Status ProcessWorkers::Hold(int segment_id, uint64_t ticket) {
  MutexLock lock(mu_);
  Segment* s = FindLocked(segment_id);
  if (s == nullptr || !s->busy || s->ticket != ticket || s->released) {
    return InvalidArgument("a stale batch descriptor (segment " + std::to_string(segment_id) + ")");
  }
  ++s->holds;
  return Status::Ok();
}

void ProcessWorkers::Unhold(int segment_id, uint64_t ticket) {
  MutexLock lock(mu_);
  Segment* s = FindLocked(segment_id);
  if (s == nullptr || !s->busy || s->ticket != ticket || s->holds == 0) return;
  if (--s->holds == 0 && s->released) FreeLocked(*s);
}

void ProcessWorkers::SetSize(const SegmentLease& lease, size_t size, size_t used) {
  MutexLock lock(mu_);
  if (Segment* s = LeasedLocked(lease)) {
    s->size = std::max(s->size, size);
    s->used = std::max(s->used, std::min(used, s->size));
    output_bytes_.store(s->size, std::memory_order_relaxed);
  }
}

void ProcessWorkers::Release(int segment_id, uint64_t ticket) {
  MutexLock lock(mu_);
  Segment* found = FindLocked(segment_id);
  if (found == nullptr || !found->busy || found->ticket != ticket) return;
  if (found->holds > 0) {
    found->released = true;
    return;
  }
  FreeLocked(*found);
}

void ProcessWorkers::FreeLocked(Segment& s) {
  s.released = false;
  s.busy = false;
  s.ticket += 1;  // descriptors of this use are stale from here on
  // Batches the consumer held by the hundred (list(loader)) made many
  // segments; past kFreeKept free ones, or free ones over half the memory
  // budget (the engine's look-ahead, which reuses them, stays within that
  // half), the memory goes back. A worker's mapping stays valid: it touches
  // a segment again only once regrown.
  int64_t free_with_memory = 0;
  size_t free_bytes = 0;
  for (const auto& t : segments_) {
    if (t->busy || t->size == 0) continue;
    ++free_with_memory;
    free_bytes += t->size;
  }
  const size_t budget = budget_bytes_.load(std::memory_order_relaxed);
  if (FreeKeptLocked() == 0) {
    DropLocked(s);
  } else if (free_with_memory > kFreeKept || (budget > 0 && free_bytes > budget / 2)) {
    EmptyLocked(s);
  }
  // Acquire hands out the largest free segment, so a large batch's segment
  // goes to the next batch and a later large one grows another: kept at
  // their largest, the segments would grow epoch after epoch on the same
  // data and eat the workers' share of the budget. One much larger than
  // the batch it held keeps only what that batch took (as a worker grows it).
  const size_t keep =
      std::max(RoundUp(s.used + s.used / 16, protocol::kSegmentGrain), protocol::kSegmentGrain);
  if (s.used > 0 && s.size > 2 * keep && ftruncate(s.fd.get(), static_cast<off_t>(keep)) == 0) {
    s.size = keep;
    s.map.reset();
  }
  if (shutdown_) DropLocked(s);
}

void ProcessWorkers::EmptyLocked(Segment& s) {
  if (s.size == 0 || !s.fd.valid() || ftruncate(s.fd.get(), 0) != 0) return;
  s.size = 0;
  s.map.reset();
}

int ProcessWorkers::FreeKeptLocked() const {
  return persistent_ || !live_pids_.empty() ? kFreeKept : 0;
}

void ProcessWorkers::DropLocked(Segment& s) {
  s.map.reset();
  s.size = 0;
  if (!s.fd.valid()) return;
  UnregisterFd(s.fd.get());
  s.fd.reset();
}

Result<SegmentView> ProcessWorkers::View(int segment_id, uint64_t ticket) {
  SegmentView view;
  std::shared_ptr<const CudaRuntime> cuda;
  {
    MutexLock lock(mu_);
    Segment* s = FindLocked(segment_id);
    if (s == nullptr || s->ticket != ticket) {
      return InvalidArgument("a stale batch descriptor (segment " + std::to_string(segment_id) +
                             ")");
    }
    STOKER_ASSIGN_OR_RETURN(view.map, MapLocked(*s, s->size));
    cuda = cuda_;
  }
  if (cuda != nullptr) {  // registering pins every page: not under the pool's lock
    STOKER_ASSIGN_OR_RETURN(const bool registered, view.map->Pin(cuda));
    if (registered) pinned_.fetch_add(1, std::memory_order_relaxed);
  }
  return view;
}

Status ProcessWorkers::Pin() {
  {
    MutexLock lock(mu_);
    if (cuda_ != nullptr) return Status::Ok();
  }
  // Loaded outside the lock (it opens a library); a second caller's load is dropped.
  STOKER_ASSIGN_OR_RETURN(std::shared_ptr<const CudaRuntime> cuda, LoadCudaRuntime());
  MutexLock lock(mu_);
  if (cuda_ == nullptr) cuda_ = std::move(cuda);
  return Status::Ok();
}

Result<std::shared_ptr<Mapping>> ProcessWorkers::MapForWrite(const SegmentLease& lease,
                                                             size_t bytes) {
  MutexLock lock(mu_);
  Segment* s = FindLocked(lease.segment_id);
  if (s == nullptr) return Internal("no segment " + std::to_string(lease.segment_id));
  return MapLocked(*s, bytes);
}

void ProcessWorkers::Shutdown() {
  if (ForeignProcess()) return;
  std::vector<int> pids;
  {
    MutexLock lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    pids = live_pids_;
  }
  batches_->Shutdown();
  // Tasks in flight fail at once (end of file on their sockets); the zygote,
  // whose children they are, collects them.
  for (int pid : pids) kill(pid, SIGKILL);
}

void ProcessWorkers::Close() {
  if (ForeignProcess()) return;
  Shutdown();
  {
    // A closed loader may stay referenced (`with ... as dl`): its free
    // segments' memory goes now; the held ones' as the consumer lets go.
    MutexLock lock(mu_);
    for (auto& s : segments_) {
      if (!s->busy) DropLocked(*s);
    }
  }
  MutexLock lock(zygote_mu_);
  if (!zygote_.valid()) return;
  // Said, not only closed: a process forked by the user after the loader may
  // hold a copy of this socket, and the zygote would never see end of file.
  (void)SendMessage(zygote_.get(), Tag::kExit, {});
  UnregisterFd(zygote_.get());
  zygote_.reset();
}

bool ProcessWorkers::shut_down() const {
  MutexLock lock(mu_);
  return shutdown_;
}

std::vector<int> ProcessWorkers::pids() const {
  MutexLock lock(mu_);
  return live_pids_;
}

size_t ProcessWorkers::segment_share() const {
  MutexLock lock(mu_);
  size_t all = 0;
  for (const auto& s : segments_) all += s->size;
  return all / std::max<size_t>(1, live_pids_.size());
}

std::pair<size_t, size_t> ProcessWorkers::segment_bytes() const {
  MutexLock lock(mu_);
  size_t all = 0, busy = 0;
  for (const auto& s : segments_) {
    all += s->size;
    if (s->busy) busy += s->size;
  }
  return {all, busy};
}

// ProcessKind

ProcessKind::ProcessKind(std::shared_ptr<ProcessWorkers> workers) : workers_(std::move(workers)) {}

SampleSpec ProcessKind::spec() const { return {{kDescriptorWords}, DType::kInt64}; }

int64_t ProcessKind::items() const { return workers_->batches().first_batches(); }

std::unique_ptr<KindWorker> ProcessKind::NewWorker(WorkerPlace, const SampleCap& cap) const {
  // On an engine thread, the engine calls Ready() as the thread starts: the
  // process is forked then, before a task needs it (a loader's first task
  // waits for iter()).
  workers_->set_budget(cap.budget_bytes);
  return std::make_unique<ProcessWorker>(workers_, cap);
}

void ProcessKind::Resized(int workers, int remote) const {
  workers_->set_running(workers - remote);
}

void ProcessKind::Cancel() const {
  workers_->Shutdown();
  workers_->batches().Shutdown();
}

void ProcessKind::Recycle(std::span<std::byte> out) const {
  int64_t d[kDescriptorWords];
  std::memcpy(d, out.data(), sizeof d);
  using D = protocol::ProcessDescriptor;
  if (d[D::kMagic] == protocol::kSegmentMagic) {
    workers_->Release(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket]));
  }
}

}  // namespace stoker::python
