#include "process_workers.h"

#include <fcntl.h>
#include <pybind11/numpy.h>
#include <pybind11/stl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cerrno>
#include <cstring>
#include <span>

#include "bindings.h"
#include "errors.h"
#include "stoker/rng.h"

namespace stoker::python {
namespace {

namespace py = pybind11;

using protocol::kMessages;
using protocol::Tag;
constexpr size_t kPage = 4096;
constexpr int kFreeKept = 8;  // free segments that keep their memory

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A message as worker_protocol.h lays it out: one send is one message.
struct Message {
  Tag::Index tag = Tag::kCount;
  std::vector<int64_t> words;  // as many as the tag has
  std::string text;            // the messages that carry text
  int fd = -1;                 // received with it, now owned by the receiver
};

// `words` in the order of the tag's list (worker_protocol.h), indexed by its enum.
Status SendMessage(int sock, Tag::Index tag, std::span<const int64_t> words, int fd = -1) {
  const protocol::MessageKind& kind = kMessages[tag];
  assert(static_cast<int>(words.size()) == kind.words);
  std::string bytes(protocol::kTagBytes, '\0');
  std::memcpy(bytes.data(), kind.tag, std::strlen(kind.tag));
  bytes.append(reinterpret_cast<const char*>(words.data()), words.size_bytes());
  iovec iov{bytes.data(), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof fd);
  }
  while (sendmsg(sock, &msg, MSG_NOSIGNAL) < 0) {
    if (errno == EINTR) continue;
    return ErrnoError("sending to a worker process", errno);
  }
  return Status::Ok();
}

// kCancelled on end of file (the other side is gone); kInternal for a tag
// the protocol does not have or a message short of its words.
Result<Message> ReceiveMessage(int sock) {
  std::array<char, 65536> buffer;
  iovec iov{buffer.data(), buffer.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  while ((n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC)) < 0) {
    if (errno != EINTR) return ErrnoError("receiving from a worker process", errno);
  }
  if (n == 0) return Cancelled("the process closed its socket");
  Message m;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      std::memcpy(&m.fd, CMSG_DATA(c), sizeof(int));
    }
  }
  const auto size = static_cast<size_t>(n);
  const std::string tag(buffer.data(), strnlen(buffer.data(), std::min(size, protocol::kTagBytes)));
  m.tag = Tag::Index{};
  while (m.tag < Tag::kCount && tag != kMessages[m.tag].tag) m.tag = Tag::Index(m.tag + 1);
  if (m.tag == Tag::kCount || size < protocol::kTagBytes) {
    if (m.fd >= 0) ::close(m.fd);
    return Internal("a worker process sent an unknown message '" + tag + "'");
  }
  const protocol::MessageKind& kind = kMessages[m.tag];
  const size_t words = static_cast<size_t>(kind.words) * sizeof(int64_t);
  if (size - protocol::kTagBytes < words) {
    if (m.fd >= 0) ::close(m.fd);
    return Internal("a worker process sent a short " + tag + " message");
  }
  m.words.resize(static_cast<size_t>(kind.words));
  std::memcpy(m.words.data(), buffer.data() + protocol::kTagBytes, words);
  if (kind.text)
    m.text.assign(buffer.data() + protocol::kTagBytes + words, size - protocol::kTagBytes - words);
  return m;
}

std::string SignalName(int sig) {
  const char* abbrev = sigabbrev_np(sig);
  return std::to_string(sig) + (abbrev != nullptr ? std::string(" (SIG") + abbrev + ")" : "");
}

// A lock-free table (fd + 1; 0 = empty), so that a child forked while another
// thread registers still reads a consistent copy.
constexpr int kMaxRegistered = 4096;
std::atomic<int> g_registered_fds[kMaxRegistered];

// How a worker process that died mid-sample is reported: SIGKILL is the
// kernel's answer to memory (the OOM killer) or someone's kill, not the
// sample's fault; a crash or an exit in the sample's code is.
Status DeathCause(const std::string& what, int64_t index, bool killed) {
  return SampleFailureStatus(what + " while loading sample " + std::to_string(index), "", killed);
}

}  // namespace

ProcessWorker::ProcessWorker(std::shared_ptr<ProcessWorkers> workers)
    : workers_(std::move(workers)) {}

ProcessWorker::~ProcessWorker() { Stop(); }

WorkerCost ProcessWorker::cost() const {
  // Its unique memory (copy-on-read growth shows there) and its share of the
  // loader's segments: summed over the workers, what they cost. Nothing
  // without a live, measured process.
  const size_t own = private_.load(std::memory_order_relaxed);
  return {.cpu_ns = cpu_ns_.load(std::memory_order_relaxed),
          .queue_ns = queue_ns_.load(std::memory_order_relaxed),
          .bytes = own == 0 ? 0 : own + workers_->segment_share(),
          .trimmable_bytes = own > baseline_.load(std::memory_order_relaxed)
                                 ? own - baseline_.load(std::memory_order_relaxed)
                                 : 0};
}

Status ProcessWorker::Start() {
  if (proc_) return Status::Ok();
  STOKER_ASSIGN_OR_RETURN(WorkerProcess started, workers_->Spawn());
  proc_ = std::move(started);
  cpu_seen_ = queue_seen_ = 0;
  baseline_.store(0, std::memory_order_relaxed);
  return Status::Ok();
}

Status ProcessWorker::Attempt(int64_t epoch, int64_t batch, const std::vector<int64_t>& indices,
                              const SegmentLease& lease, Reply* reply, ItemOutcome* outcome) {
  STOKER_RETURN_IF_ERROR(Start());
  const size_t n = indices.size();
  const size_t data_off = RoundUp((protocol::kSegmentHeaderWords + n) * sizeof(int64_t), kPage);
  STOKER_ASSIGN_OR_RETURN(auto map, workers_->MapForWrite(lease, data_off));
  auto* words = static_cast<int64_t*>(map->addr);
  using H = protocol::SegmentWord;
  words[H::kMagic] = protocol::kSegmentMagic;
  words[H::kPosition] = -1;
  words[H::kSamples] = static_cast<int64_t>(n);
  words[H::kDataOffset] = static_cast<int64_t>(data_off);
  words[H::kSeed] = BatchSeed(workers_->seed(), epoch, batch);
  std::copy(indices.begin(), indices.end(), words + protocol::kSegmentHeaderWords);
  const int id = lease.segment->id;
  const bool known = std::find(proc_->known_segments.begin(), proc_->known_segments.end(), id) !=
                     proc_->known_segments.end();
  using T = protocol::TaskWord;
  protocol::Words<T> task{};
  task[T::kEpoch] = epoch;
  task[T::kBatch] = batch;
  task[T::kSegment] = id;
  task[T::kSegmentSize] = static_cast<int64_t>(map->size);
  STOKER_RETURN_IF_ERROR(
      SendMessage(proc_->conn.get(), Tag::kTask, task, known ? -1 : lease.segment->fd.get()));
  if (!known) proc_->known_segments.push_back(id);
  while (true) {
    STOKER_ASSIGN_OR_RETURN(Message m, ReceiveMessage(proc_->conn.get()));
    if (m.tag == Tag::kTaskFail) return DataError(m.text);
    if (m.tag == Tag::kSampleFail) {
      // Its text: the exception, a NUL, the worker's traceback.
      using F = protocol::SampleFailWord;
      const size_t nul = std::min(m.text.find('\0'), m.text.size());
      const std::string trace = nul < m.text.size() ? m.text.substr(nul + 1) : "";
      outcome->failures.push_back({m.words[F::kIndex], "",
                                   SampleFailureStatus(m.text.substr(0, nul), trace,
                                                       m.words[F::kNotTheSamplesFault] != 0)});
      continue;
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

Status ProcessWorker::RunInSegment(int64_t epoch, int64_t batch, std::vector<int64_t> indices,
                                   const SegmentLease& lease, Reply* reply, ItemOutcome* outcome) {
  int deaths_outside = 0;
  while (true) {
    if (workers_->shut_down()) return Cancelled("the loader was closed");
    if (indices.empty()) return Status::Ok();  // every sample went down with a worker
    const size_t reported = outcome->failures.size();
    Status st = Attempt(epoch, batch, indices, lease, reply, outcome);
    if (st.ok()) return st;
    if (st.code() != StatusCode::kCancelled || !proc_) return st;
    // The process died mid-task: blame the sample it was on and run the rest
    // in a fresh process, which reports the others' failures again.
    outcome->failures.resize(reported);
    const int pid = proc_->pid;
    const ProcessWorkers::Ending ending = workers_->Reap(*proc_);
    proc_.reset();
    if (workers_->shut_down()) return Cancelled("the loader was closed");
    STOKER_ASSIGN_OR_RETURN(
        auto map, workers_->MapForWrite(lease, protocol::kSegmentHeaderWords * sizeof(int64_t)));
    const int64_t position =
        static_cast<const int64_t*>(map->addr)[protocol::SegmentWord::kPosition];
    const std::string what = "worker process " + std::to_string(pid) + " " + ending.how;
    if (position >= 0 && position < static_cast<int64_t>(indices.size())) {
      const int64_t index = indices[static_cast<size_t>(position)];
      outcome->failures.push_back({index, "", DeathCause(what, index, ending.killed)});
      indices.erase(indices.begin() + position);
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
  // The process starts while the batch list may still be on its way (a loader
  // claims its first tasks when made, the list comes with iter()).
  if (workers_->shut_down()) return Cancelled("the loader was closed");
  STOKER_RETURN_IF_ERROR(Start());
  STOKER_ASSIGN_OR_RETURN(std::vector<int64_t> indices, workers_->batches().Indices(epoch, item));
  const size_t header =
      RoundUp((protocol::kSegmentHeaderWords + indices.size()) * sizeof(int64_t), kPage);
  STOKER_ASSIGN_OR_RETURN(SegmentLease lease, workers_->Acquire(header));
  Reply reply;
  Status st = RunInSegment(epoch, item, std::move(indices), lease, &reply, outcome);
  if (!st.ok()) {
    workers_->Release(lease.segment->id, lease.ticket);
    return st;
  }
  if (reply.size > 0) workers_->SetSize(lease, static_cast<size_t>(reply.size));
  using D = protocol::ProcessDescriptor;
  int64_t d[kDescriptorWords];
  d[D::kMagic] = protocol::kSegmentMagic;
  d[D::kSegment] = lease.segment->id;
  d[D::kTicket] = static_cast<int64_t>(lease.ticket);
  d[D::kSegmentSize] = reply.size;
  d[D::kMetaOffset] = reply.meta_off;
  d[D::kMetaLength] = reply.meta_len;
  d[D::kEpoch] = epoch;
  d[D::kBatch] = item;
  std::memcpy(out.data(), d, sizeof d);
  outcome->label = item;
  outcome->samples = reply.samples;
  return Status::Ok();
}

void ProcessWorker::Stop() {
  if (!proc_) return;
  (void)SendMessage(proc_->conn.get(), Tag::kExit, {});
  workers_->Reap(*proc_);
  proc_.reset();
  private_.store(0, std::memory_order_relaxed);
}

namespace {}  // namespace

Status SampleFailureStatus(const std::string& reason, const std::string& trace,
                           bool not_the_samples_fault) {
  std::string text = reason;
  if (not_the_samples_fault) text += " (not the sample's fault: never skipped)";
  if (!trace.empty()) text += "\n\nIn the worker:\n" + trace;
  return not_the_samples_fault ? Unavailable(std::move(text)) : DataError(std::move(text));
}

// The seed of batch `batch` of `epoch` (-1: the epoch's shuffle), on streams
// apart from every sample's: a non-negative int64, so that every generator
// (Python's, numpy's, torch's) takes it. A batch always runs whole, in order,
// in one process, so one seed per batch gives the same data whichever worker
// runs it -- at a per-sample cost a trivial sample would notice (tens of us).
int64_t BatchSeed(uint64_t seed, int64_t epoch, int64_t batch) {
  constexpr uint64_t kBatchStreams = uint64_t{1} << 62;
  SampleRng rng(seed, static_cast<uint64_t>(epoch), kBatchStreams + static_cast<uint64_t>(batch));
  return static_cast<int64_t>(rng.NextU64() >> 1);
}

Mapping::~Mapping() {
  pinned_.reset();  // unregistered before it is unmapped
  if (addr != nullptr && addr != MAP_FAILED) munmap(addr, size);
}

Result<bool> Mapping::Pin(const std::shared_ptr<const CudaRuntime>& cuda) {
  std::lock_guard<std::mutex> lock(pin_mu_);
  if (pinned_ != nullptr) return false;
  STOKER_ASSIGN_OR_RETURN(pinned_, HostRegistration::Make(cuda, addr, size, "a batch segment"));
  return true;
}

void RegisterFd(int fd) {
  for (auto& slot : g_registered_fds) {
    int empty = 0;
    if (slot.compare_exchange_strong(empty, fd + 1)) return;
  }
}

void UnregisterFd(int fd) {
  for (auto& slot : g_registered_fds) {
    int expected = fd + 1;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

void CloseRegisteredFds(int keep) {
  for (auto& slot : g_registered_fds) {
    const int fd = slot.exchange(0) - 1;
    if (fd >= 0 && fd != keep) ::close(fd);
  }
}

// ProcessWorkers

ProcessWorkers::ProcessWorkers(int zygote_fd, int zygote_pid, uint64_t seed,
                               std::shared_ptr<EpochBatches> batches)
    : seed_(seed),
      batches_(std::move(batches)),
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
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& s : segments_) UnregisterFd(s->fd.get());
}

Result<WorkerProcess> ProcessWorkers::Spawn() {
  int id = 0;
  int workers = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutdown_) return Cancelled("the loader was closed");
    while (id < static_cast<int>(ids_in_use_.size()) && ids_in_use_[static_cast<size_t>(id)]) ++id;
    if (id == static_cast<int>(ids_in_use_.size())) ids_in_use_.push_back(false);
    ids_in_use_[static_cast<size_t>(id)] = true;
    workers = static_cast<int>(std::count(ids_in_use_.begin(), ids_in_use_.end(), true));
  }
  auto give_back_id = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    ids_in_use_[static_cast<size_t>(id)] = false;
  };
  Message forked;
  {
    std::lock_guard<std::mutex> lock(zygote_mu_);
    protocol::Words<protocol::ForkWord> fork{};
    fork[protocol::ForkWord::kWorkerId] = id;
    fork[protocol::ForkWord::kNumWorkers] = workers;
    Status st = SendMessage(zygote_.get(), Tag::kFork, fork);
    Result<Message> r = st.ok() ? ReceiveMessage(zygote_.get()) : Result<Message>(st);
    if (!r.ok()) {
      give_back_id();
      return Unavailable("the worker fork server (pid " + std::to_string(zygote_pid_) +
                         ") is gone: " + r.status().message());
    }
    forked = std::move(*r);
  }
  if (forked.tag != Tag::kForked || forked.fd < 0) {
    give_back_id();
    if (forked.fd >= 0) ::close(forked.fd);
    return Unavailable("the worker fork server could not start a worker: " + forked.text);
  }
  WorkerProcess w;
  w.pid = static_cast<int>(forked.words[protocol::ForkedWord::kPid]);
  w.id = id;
  w.conn.reset(forked.fd);
  RegisterFd(forked.fd);
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_pids_.push_back(w.pid);
    if (shutdown_) kill(w.pid, SIGKILL);  // Shutdown ran while it was forked
  }
  Result<Message> hello = ReceiveMessage(w.conn.get());
  if (hello.ok() && hello->tag == Tag::kHello) return w;
  std::string why = !hello.ok() ? "it exited before its greeting: " + Reap(w).how
                                : "worker_init_fn raised: " + hello->text;
  if (hello.ok()) Reap(w);
  return Internal("worker " + std::to_string(id) + " (pid " + std::to_string(w.pid) +
                  ") could not start: " + why);
}

ProcessWorkers::Ending ProcessWorkers::Reap(const WorkerProcess& worker) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::erase(live_pids_, worker.pid);
    if (worker.id >= 0 && worker.id < static_cast<int>(ids_in_use_.size())) {
      ids_in_use_[static_cast<size_t>(worker.id)] = false;
    }
  }
  UnregisterFd(worker.conn.get());
  std::lock_guard<std::mutex> lock(zygote_mu_);
  protocol::Words<protocol::ReapWord> reap{};
  reap[protocol::ReapWord::kPid] = worker.pid;
  Result<Message> r = SendMessage(zygote_.get(), Tag::kReap, reap).ok()
                          ? ReceiveMessage(zygote_.get())
                          : Result<Message>(Cancelled("no fork server"));
  if (!r.ok() || r->tag != Tag::kReaped) return {"ended (cause unknown)", false};
  const int64_t value = r->words[protocol::ReapedWord::kValue];
  if (r->words[protocol::ReapedWord::kSignalled] == 0) {
    return {"exited with code " + std::to_string(value), false};
  }
  std::string how = "was killed by signal " + SignalName(static_cast<int>(value));
  if (value == SIGKILL) how += ", perhaps by the kernel for lack of memory";
  return {how, value == SIGKILL};
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
  std::lock_guard<std::mutex> lock(mu_);
  if (shutdown_) return Cancelled("the loader was closed");
  Segment* pick = nullptr;
  for (auto& s : segments_) {
    if (!s->busy && (pick == nullptr || s->size > pick->size)) pick = s.get();
  }
  if (pick == nullptr) {
    const int fd = memfd_create("stoker-batch", MFD_CLOEXEC);
    if (fd < 0) return ErrnoError("creating a shared-memory segment (memfd_create)", errno);
    auto s = std::make_unique<Segment>();
    s->id = static_cast<int>(segments_.size());
    s->fd.reset(fd);
    RegisterFd(fd);
    segments_.push_back(std::move(s));
    pick = segments_.back().get();
  }
  STOKER_RETURN_IF_ERROR(MapLocked(*pick, bytes).status());
  pick->busy = true;
  pick->ticket += 1;
  return SegmentLease{pick, pick->ticket};
}

void ProcessWorkers::SetSize(const SegmentLease& lease, size_t size) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease.segment->ticket == lease.ticket)
    lease.segment->size = std::max(lease.segment->size, size);
}

void ProcessWorkers::Release(int segment_id, uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mu_);
  if (segment_id < 0 || segment_id >= static_cast<int>(segments_.size())) return;
  Segment& s = *segments_[static_cast<size_t>(segment_id)];
  if (!s.busy || s.ticket != ticket) return;
  s.busy = false;
  s.ticket += 1;  // descriptors of this use are stale from here on
  // Batches the consumer held by the hundred (list(loader)) made many
  // segments; past kFreeKept free ones the memory goes back. A worker's
  // mapping stays valid: it touches a segment again only once regrown.
  const auto free_with_memory = std::count_if(segments_.begin(), segments_.end(),
                                              [](auto& t) { return !t->busy && t->size > 0; });
  if (free_with_memory > kFreeKept && ftruncate(s.fd.get(), 0) == 0) {
    s.size = 0;
    s.map.reset();
  }
}

Result<SegmentView> ProcessWorkers::View(int segment_id, uint64_t ticket) {
  std::unique_lock<std::mutex> lock(mu_);
  if (segment_id < 0 || segment_id >= static_cast<int>(segments_.size()) ||
      segments_[static_cast<size_t>(segment_id)]->ticket != ticket) {
    return InvalidArgument("a stale batch descriptor (segment " + std::to_string(segment_id) + ")");
  }
  Segment& s = *segments_[static_cast<size_t>(segment_id)];
  STOKER_ASSIGN_OR_RETURN(auto map, MapLocked(s, s.size));
  SegmentView view{std::move(map)};
  if (cuda_ != nullptr) {
    lock.unlock();  // registering pins every page: not under the pool's lock
    STOKER_ASSIGN_OR_RETURN(const bool registered, view.map->Pin(cuda_));
    if (registered) pinned_.fetch_add(1, std::memory_order_relaxed);
  }
  return view;
}

Status ProcessWorkers::Pin() {
  if (cuda_ != nullptr) return Status::Ok();
  STOKER_ASSIGN_OR_RETURN(cuda_, CudaRuntime::Load());
  return Status::Ok();
}

Result<std::shared_ptr<Mapping>> ProcessWorkers::MapForWrite(const SegmentLease& lease,
                                                             size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return MapLocked(*lease.segment, bytes);
}

void ProcessWorkers::Shutdown() {
  if (ForeignProcess()) return;
  std::vector<int> pids;
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(zygote_mu_);
  if (!zygote_.valid()) return;
  // Said, not only closed: a process forked by the user after the loader may
  // hold a copy of this socket, and the zygote would never see end of file.
  (void)SendMessage(zygote_.get(), Tag::kExit, {});
  UnregisterFd(zygote_.get());
  zygote_.reset();
}

bool ProcessWorkers::shut_down() const {
  std::lock_guard<std::mutex> lock(mu_);
  return shutdown_;
}

std::vector<int> ProcessWorkers::pids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_pids_;
}

size_t ProcessWorkers::segment_share() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t all = 0;
  for (const auto& s : segments_) all += s->size;
  return all / std::max<size_t>(1, live_pids_.size());
}

std::pair<size_t, size_t> ProcessWorkers::segment_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
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

int64_t ProcessKind::items() const { return workers_->batches().batches_per_epoch(); }

std::unique_ptr<KindWorker> ProcessKind::NewWorker(WorkerPlace place, const SampleCap&) const {
  // On an engine thread as it starts: the process is forked now, before a
  // task needs it (a loader's first task waits for iter()). A failure is
  // reported by the first task, which tries again.
  auto worker = std::make_unique<ProcessWorker>(workers_);
  if (place == WorkerPlace::kWorkerThread && !workers_->shut_down()) (void)worker->Start();
  return worker;
}

void ProcessKind::Recycle(std::span<std::byte> out) const {
  int64_t d[kDescriptorWords];
  std::memcpy(d, out.data(), sizeof d);
  using D = protocol::ProcessDescriptor;
  if (d[D::kMagic] == protocol::kSegmentMagic) {
    workers_->Release(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket]));
  }
}

// Bindings

namespace {

// A delivered batch's segment as a numpy uint8 array whose base owns the
// mapping and `keep` (the engine's descriptor array, which owns the engine's
// slot): the segment goes back to the pool when the last view of it is gone.
py::array ViewOf(ProcessWorkers& workers, py::array_t<int64_t> descriptor) {
  using D = protocol::ProcessDescriptor;
  if (descriptor.size() < kDescriptorWords ||
      descriptor.data()[D::kMagic] != protocol::kSegmentMagic) {
    throw py::value_error("not a batch descriptor");
  }
  const int64_t* d = descriptor.data();
  SegmentView view = ValueOrThrow(
      workers.View(static_cast<int>(d[D::kSegment]), static_cast<uint64_t>(d[D::kTicket])));
  struct Keep {
    std::shared_ptr<Mapping> map;
    py::object descriptor;
  };
  void* addr = view.map->addr;
  const auto size = static_cast<py::ssize_t>(view.map->size);
  auto* keep = new Keep{std::move(view.map), descriptor};
  py::capsule base(keep, [](void* p) { delete static_cast<Keep*>(p); });
  py::array array(py::dtype("uint8"), {size}, static_cast<uint8_t*>(addr), base);
  return array;
}

}  // namespace

void BindProcessWorkers(py::module_& m) {
  m.def("batch_seed", &BatchSeed, py::arg("seed"), py::arg("epoch"), py::arg("batch"),
        "The seed a worker gives Python's, numpy's and torch's generators before a batch's "
        "first sample (batch -1: the epoch's shuffle).");
  m.def("register_fd", &RegisterFd, py::arg("fd"));
  m.def("unregister_fd", &UnregisterFd, py::arg("fd"));
  m.def("close_registered_fds", &CloseRegisteredFds, py::arg("keep") = -1,
        "In a forked child: closes the segments and sockets of every stoker loader.");

  py::class_<EpochBatches, std::shared_ptr<EpochBatches>>(m, "EpochBatches")
      .def(py::init<int64_t>(), py::arg("batches_per_epoch"))
      .def(
          "set",
          [](EpochBatches& b, int64_t epoch, std::vector<int64_t> flat,
             std::vector<int64_t> offsets) {
            ThrowIfError(b.Set(epoch, std::move(flat), std::move(offsets)));
          },
          py::arg("epoch"), py::arg("flat"), py::arg("offsets"))
      .def("has", &EpochBatches::Has, py::arg("epoch"))
      .def("shutdown", &EpochBatches::Shutdown);

  py::class_<ProcessWorkers, std::shared_ptr<ProcessWorkers>>(m, "ProcessWorkers")
      .def(py::init<int, int, uint64_t, std::shared_ptr<EpochBatches>>(), py::arg("zygote_fd"),
           py::arg("zygote_pid"), py::arg("seed"), py::arg("batches"))
      .def("as_kind",
           [](const std::shared_ptr<ProcessWorkers>& w) {
             return KindHandle{std::make_shared<ProcessKind>(w)};
           })
      .def("view", &ViewOf, py::arg("descriptor"))
      .def("shutdown", &ProcessWorkers::Shutdown, py::call_guard<py::gil_scoped_release>())
      .def("close", &ProcessWorkers::Close, py::call_guard<py::gil_scoped_release>())
      .def("pin", [](ProcessWorkers& w) { ThrowIfError(w.Pin()); })
      .def_property_readonly("pinned_mappings", &ProcessWorkers::pinned_mappings)
      .def("pids", &ProcessWorkers::pids)
      .def("segment_bytes", &ProcessWorkers::segment_bytes);
}

}  // namespace stoker::python
