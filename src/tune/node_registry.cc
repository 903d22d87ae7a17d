#include "tune/node_registry.h"

#include <fcntl.h>
#include <signal.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>
#include <type_traits>

#include "core/fd_registry.h"
#include "stoker/tuning.h"

namespace stoker {
namespace {

constexpr char kMagic[8] = {'s', 't', 'o', 'k', 'n', 'o', 'd', 'e'};
// 2: heartbeats on CLOCK_REALTIME (one clock for every time namespace).
// 3: samples/s, share, prefetch and fixed-count loaders, for the monitor.
constexpr uint32_t kVersion = 3;

// One loader's slot. Written only under the file lock. The record is
// stored as it is: the header's entry size (and version) tell a table of
// another layout.
struct Entry {
  uint64_t token;  // 0: free
  int64_t heartbeat_ns;
  uint64_t start_ticks;  // of its process; 0 unknown
  uint64_t pid_ns;       // inode of its pid namespace; 0 unknown
  uint64_t loader_id;
  int32_t pid;
  int32_t reserved;
  NodeLoaderRecord record;
};

// Heartbeats: the one clock no time namespace shifts (a loader in another
// must not look forever young, nor forever stale).
int64_t HeartbeatNs() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

uint64_t PidNamespace() {
  struct stat st;
  return ::stat("/proc/self/ns/pid", &st) == 0 ? static_cast<uint64_t>(st.st_ino) : 0;
}

uint64_t NewToken() {
  std::random_device rd;
  uint64_t t = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^
               static_cast<uint64_t>(HeartbeatNs()) * 0x9e3779b97f4a7c15ull;
  return t == 0 ? 1 : t;
}

std::atomic<uint64_t> next_loader_id{1};

// Entry `e` as the registry lists it at `now_ns` (self false).
NodeLoader Listed(const Entry& e, int64_t now_ns) {
  NodeLoader l;
  l.record = e.record;
  l.pid = e.pid;
  l.loader_id = e.loader_id;
  l.heartbeat_age_s = static_cast<double>(now_ns - e.heartbeat_ns) * 1e-9;
  l.same_pid_namespace = e.pid_ns == 0 || e.pid_ns == PidNamespace();
  return l;
}

// Takes an OFD lock of `type` (F_RDLCK, F_WRLCK) on the whole file, or
// F_UNLCK drops it, trying up to `tries` times `pause` apart rather than
// wait: 0, EAGAIN when it stayed busy, or another errno.
int LockFile(int fd, short type, int tries = 1,
             std::chrono::microseconds pause = std::chrono::microseconds(0)) {
  struct flock lock = {};
  lock.l_type = type;
  lock.l_whence = SEEK_SET;
  for (int tried = 1; ::fcntl(fd, F_OFD_SETLK, &lock) != 0; ++tried) {
    if (errno != EAGAIN && errno != EACCES) return errno;
    if (tried >= tries) return EAGAIN;
    std::this_thread::sleep_for(pause);
  }
  return 0;
}

// $STOKER_NODE_REGISTRY when set to something (empty: as if unset).
const char* ChosenPath() {
  const char* set = std::getenv("STOKER_NODE_REGISTRY");
  return set != nullptr && *set != '\0' ? set : nullptr;
}

// Why there is no registry when $STOKER_NODE_REGISTRY turns it off.
std::string TurnedOff() {
  return std::string("node registry turned off ($STOKER_NODE_REGISTRY=") + ChosenPath() + ")";
}

// Why a chosen relative path is refused: loaders started in other folders
// would each have a table of their own.
std::string RelativeChosen(const std::string& path) {
  return "node registry $STOKER_NODE_REGISTRY=" + path +
         ": not an absolute path (every loader on the machine must name the same file)";
}

// Whether entry `e` holds a live loader at `now_ns`, as seen from pid
// namespace `pid_ns`: taken, its heartbeat within stale_s, and (once older
// than check_pid_after_s, in our pid namespace) its process still there.
bool EntryLive(const Entry& e, int64_t now_ns, const NodeRegistryOptions& options,
               uint64_t pid_ns) {
  if (e.token == 0) return false;
  const double age_s = static_cast<double>(now_ns - e.heartbeat_ns) * 1e-9;
  // From the future (a clock set back, a forged entry): judged by our clock.
  if (age_s > options.stale_s || age_s < -options.stale_s) return false;
  if (age_s <= options.check_pid_after_s || e.pid_ns == 0 || e.pid_ns != pid_ns) {
    // Young, or in another pid namespace (its pid means nothing here).
    return true;
  }
  if (const std::optional<ProcessStart> s = ReadProcessStart(e.pid)) {
    return !s->zombie && (e.start_ticks == 0 || s->ticks == e.start_ticks);
  }
  return !(::kill(e.pid, 0) != 0 && errno == ESRCH);
}

}  // namespace

struct NodeRegistry::Table {
  char magic[8];
  uint32_t version;
  uint32_t entries;
  uint32_t entry_bytes;
  uint32_t reserved;
  Entry entry[kEntries];
};
static_assert(std::is_trivially_copyable_v<Entry> && sizeof(Entry) == 120);
static_assert(std::is_trivially_copyable_v<NodeLoaderRecord>);

std::optional<ProcessStart> ReadProcessStart(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!in || !std::getline(in, text)) return std::nullopt;
  // The command name (field 2) may hold spaces and parentheses: the fields
  // after it start past the last ')'.
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::istringstream fields(text.substr(close + 1));
  std::string state;
  fields >> state;  // field 3
  std::string skip;
  for (int field = 4; field < 22 && fields >> skip; ++field) {
  }
  uint64_t ticks = 0;
  if (!(fields >> ticks)) return std::nullopt;
  return ProcessStart{ticks, state == "Z" || state == "X"};
}

std::vector<std::string> NodeRegistry::DefaultPaths() {
  if (const char* set = ChosenPath()) {
    if (::strcasecmp(set, "off") == 0) return {};
    return {set};
  }
  // The layout's version is in the name: loaders of another version keep
  // their own table rather than refuse this one. Each lies in a folder only
  // its user may write: in a shared /dev/shm or /tmp, another user could
  // otherwise create (or link) the name first.
  const std::string name = "node-v" + std::to_string(kVersion);
  const std::string dir = "stoker-" + std::to_string(::getuid());
  std::vector<std::string> paths = {"/dev/shm/" + dir + "/" + name};
  if (const char* run = std::getenv("XDG_RUNTIME_DIR"); run != nullptr && *run == '/') {
    paths.push_back(std::string(run) + "/stoker-" + name);
  }
  paths.push_back("/tmp/" + dir + "/" + name);
  return paths;
}

namespace {

// `dir` exists (made 0700 if not), is a folder (not a link), is this user's,
// and no one else may write in it.
Status PrivateFolder(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    return ErrnoError("node registry folder " + dir + ": cannot create", errno);
  }
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0) return ErrnoError("node registry folder " + dir, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != ::getuid() || (st.st_mode & 022) != 0) {
    return Unavailable("node registry folder " + dir + ": not a folder only this user can write");
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<NodeRegistry>> NodeRegistry::OpenDefault(bool* busy) {
  const std::vector<std::string> paths = DefaultPaths();
  if (paths.empty()) {
    return Unavailable(TurnedOff());
  }
  const bool chosen = ChosenPath() != nullptr;
  if (chosen && paths.front().front() != '/') return Unavailable(RelativeChosen(paths.front()));
  std::string why;
  for (const std::string& path : paths) {
    if (!chosen) {
      if (Status st = PrivateFolder(path.substr(0, path.rfind('/'))); !st.ok()) {
        why += (why.empty() ? "" : "; ") + st.message();
        continue;
      }
    }
    bool locked = false;
    Result<std::unique_ptr<NodeRegistry>> r = Open(path, {}, &locked);
    if (r.ok()) return r;
    why += (why.empty() ? "" : "; ") + r.status().message();
    if (locked) {
      if (busy != nullptr) *busy = true;
      break;
    }
  }
  return Unavailable("no node registry: " + why);
}

Result<std::unique_ptr<NodeRegistry>> NodeRegistry::Open(const std::string& path,
                                                         NodeRegistryOptions options, bool* busy) {
  // O_NOFOLLOW and the owner check: in a shared /tmp another user could
  // have put a link or a file of theirs there.
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!fd.valid()) return ErrnoError("node registry " + path + ": cannot open", errno);
  // Creation and first initialisation under the lock: two loaders starting
  // together must not both write the header.
  if (const int err = LockFile(fd.get(), F_WRLCK, 200, std::chrono::milliseconds(1)); err != 0) {
    if (err != EAGAIN) return ErrnoError("node registry " + path + ": cannot lock", err);
    if (busy != nullptr) *busy = true;
    return Unavailable("node registry " + path + ": lock busy while opening");
  }
  auto unlock = [&] { LockFile(fd.get(), F_UNLCK); };
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    unlock();
    return ErrnoError("node registry " + path + ": cannot stat", err);
  }
  // A hard link to another file of ours would pass the owner check.
  if (!S_ISREG(st.st_mode) || st.st_uid != ::getuid() || st.st_nlink != 1 ||
      (st.st_mode & S_IWOTH) != 0) {
    unlock();
    return Unavailable("node registry " + path +
                       ": not a regular file of this user, with one link, that only it can write");
  }
  const size_t bytes = sizeof(Table);
  if (st.st_size == 0) {
    // Reserve the pages now: a full tmpfs would otherwise fail a later write
    // to the mapping with SIGBUS instead of this error.
    if (const int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes)); err != 0) {
      unlock();
      return ErrnoError(
          "node registry " + path + ": cannot reserve " + std::to_string(bytes) + " bytes", err);
    }
  } else if (static_cast<size_t>(st.st_size) != bytes) {
    unlock();
    return DataError("node registry " + path + ": " + std::to_string(st.st_size) +
                     " bytes, not a stoker node registry of version " + std::to_string(kVersion) +
                     " (" + std::to_string(bytes) + " bytes)");
  }
  // Read and written with pread/pwrite under the lock, never mapped: a file
  // another process truncates must not be able to kill us (SIGBUS).
  auto table = std::make_unique<Table>();
  if (::pread(fd.get(), table.get(), bytes, 0) != static_cast<ssize_t>(bytes)) {
    const int err = errno;
    unlock();
    return ErrnoError("node registry " + path + ": cannot read", err);
  }
  static const char kZero[8] = {};
  if (std::memcmp(table->magic, kZero, sizeof kZero) == 0) {
    // New, or its creator died before writing the header: entries are zero.
    *table = Table{};
    table->version = kVersion;
    table->entries = kEntries;
    table->entry_bytes = sizeof(Entry);
    std::memcpy(table->magic, kMagic, sizeof kMagic);
    if (::pwrite(fd.get(), table.get(), bytes, 0) != static_cast<ssize_t>(bytes)) {
      const int err = errno;
      unlock();
      return ErrnoError("node registry " + path + ": cannot write", err);
    }
  } else if (!HeaderFits(*table)) {
    unlock();
    return DataError("node registry " + path + ": not a stoker node registry of version " +
                     std::to_string(kVersion));
  }
  unlock();
  return std::unique_ptr<NodeRegistry>(
      new NodeRegistry(path, std::move(fd), std::move(table), options));
}

bool NodeRegistry::Detached() const {
  struct stat held, there;
  if (::fstat(fd_.get(), &held) != 0) return false;
  if (held.st_nlink == 0) return true;
  return ::stat(path_.c_str(), &there) != 0
             ? errno == ENOENT
             : there.st_dev != held.st_dev || there.st_ino != held.st_ino;
}

bool NodeRegistry::Damaged() const {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return false;
  if (st.st_size != static_cast<off_t>(sizeof(Table))) return true;
  char header[offsetof(Table, entry)];
  return ::pread(fd_.get(), header, sizeof header, 0) != static_cast<ssize_t>(sizeof header) ||
         std::memcmp(header, table_.get(), sizeof header) != 0;
}

bool NodeRegistry::HeaderFits(const Table& table) {
  return std::memcmp(table.magic, kMagic, sizeof kMagic) == 0 && table.version == kVersion &&
         table.entries == kEntries && table.entry_bytes == sizeof(Entry);
}

Status NodeRegistry::Load() {
  struct stat st;
  if (::fstat(fd_.get(), &st) != 0) return ErrnoError("node registry " + path_, errno);
  if (st.st_size != static_cast<off_t>(sizeof(Table)) ||
      ::pread(fd_.get(), table_.get(), sizeof(Table), 0) != static_cast<ssize_t>(sizeof(Table)) ||
      !HeaderFits(*table_)) {
    return Unavailable("node registry " + path_ + ": changed under this loader (" +
                       std::to_string(st.st_size) + " bytes, or another header)");
  }
  return Status::Ok();
}

Status NodeRegistry::Store() {
  if (::pwrite(fd_.get(), table_.get(), sizeof(Table), 0) != static_cast<ssize_t>(sizeof(Table))) {
    return ErrnoError("node registry " + path_ + ": cannot write", errno);
  }
  return Status::Ok();
}

NodeRegistry::NodeRegistry(std::string path, UniqueFd fd, std::unique_ptr<Table> table,
                           NodeRegistryOptions options)
    : path_(std::move(path)),
      fd_(std::move(fd)),
      table_(std::move(table)),
      options_(options),
      loader_id_(next_loader_id.fetch_add(1)),
      token_(NewToken()),
      start_ticks_(ReadProcessStart(::getpid()).value_or(ProcessStart{}).ticks),
      pid_ns_(PidNamespace()),
      pid_(::getpid()) {
  RegisterFd(fd_.get());  // not for a zygote to keep, nor the workers it forks
}

NodeRegistry::~NodeRegistry() {
  // In a forked child the entry is the parent's. A busy lock leaves the
  // entry to go stale: the others free it within stale_s.
  if (::getpid() == pid_) UnregisterFd(fd_.get());
  if (::getpid() == pid_ && Lock().ok()) {
    if (Load().ok()) {
      if (const int own = FindOwn(); own >= 0) {
        table_->entry[own] = Entry{};
        (void)Store();
      }
    }
    Unlock();
  }
}

Status NodeRegistry::Lock() {
  // Held for microseconds by each publisher; a holder that is stopped (not
  // dead: the kernel drops a dead one's lock) must not stall our consumer.
  if (LockFile(fd_.get(), F_WRLCK, 21, std::chrono::microseconds(250)) != 0) {
    return Unavailable("node registry " + path_ + ": lock busy");
  }
  return Status::Ok();
}

void NodeRegistry::Unlock() { LockFile(fd_.get(), F_UNLCK); }

int NodeRegistry::FindOwn() const {
  for (int i = 0; i < kEntries; ++i) {
    const Entry& e = table_->entry[i];
    if (e.token == token_ && e.pid == pid_) return i;
  }
  return -1;
}

bool NodeRegistry::Live(int index, int64_t now_ns) const {
  return EntryLive(table_->entry[index], now_ns, options_, pid_ns_);
}

Result<std::vector<NodeLoader>> NodeRegistry::Read(const std::string& path,
                                                   NodeRegistryOptions options) {
  // O_NONBLOCK: a FIFO at the path must not hold the monitor until a writer comes.
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno == ENOENT) return NotFound("node registry " + path + ": no such file");
    return ErrnoError("node registry " + path + ": cannot open", errno);
  }
  if (LockFile(fd.get(), F_RDLCK, 200, std::chrono::milliseconds(1)) != 0) {
    return Unavailable("node registry " + path + ": lock busy");
  }
  struct stat st;
  auto table = std::make_unique<Table>();
  if (::fstat(fd.get(), &st) == 0 && S_ISDIR(st.st_mode)) {
    LockFile(fd.get(), F_UNLCK);
    return DataError("node registry " + path + ": a folder, not a file");
  }
  const bool read =
      ::fstat(fd.get(), &st) == 0 && S_ISREG(st.st_mode) &&
      st.st_size == static_cast<off_t>(sizeof(Table)) &&
      ::pread(fd.get(), table.get(), sizeof(Table), 0) == static_cast<ssize_t>(sizeof(Table));
  LockFile(fd.get(), F_UNLCK);
  static const char kZero[8] = {};
  if (read && std::memcmp(table->magic, kZero, sizeof kZero) == 0) return std::vector<NodeLoader>{};
  if (!read || !HeaderFits(*table)) {
    return DataError("node registry " + path + ": not a stoker node registry of version " +
                     std::to_string(kVersion));
  }
  const int64_t now = HeartbeatNs();
  const uint64_t pid_ns = PidNamespace();
  std::vector<NodeLoader> live;
  for (const Entry& e : table->entry) {
    if (!EntryLive(e, now, options, pid_ns)) continue;
    live.push_back(Listed(e, now));
  }
  return live;
}

Result<std::vector<NodeLoader>> NodeRegistry::Publish(const NodeLoaderRecord& record) {
  STOKER_RETURN_IF_ERROR(Lock());
  if (Status st = Load(); !st.ok()) {
    Unlock();
    return st;
  }
  const int64_t now = HeartbeatNs();
  int own = FindOwn();
  for (int i = 0; i < kEntries; ++i) {
    if (i != own && table_->entry[i].token != 0 && !Live(i, now)) table_->entry[i] = Entry{};
  }
  if (own < 0) {
    for (int i = 0; i < kEntries && own < 0; ++i) {
      if (table_->entry[i].token == 0) own = i;
    }
    if (own < 0) {
      Unlock();
      return Unavailable("node registry " + path_ + ": all " + std::to_string(kEntries) +
                         " entries taken by live loaders");
    }
    Entry& e = table_->entry[own];
    e = Entry{};
    e.token = token_;
    e.pid = pid_;
    e.start_ticks = start_ticks_;
    e.pid_ns = pid_ns_;
    e.loader_id = loader_id_;
  }
  Entry& e = table_->entry[own];
  e.heartbeat_ns = now;
  e.record = record;
  std::vector<NodeLoader> live;
  for (int i = 0; i < kEntries; ++i) {
    const Entry& x = table_->entry[i];
    if (x.token == 0) continue;
    live.push_back(Listed(x, now));
    live.back().self = i == own;
  }
  Status st = Store();
  Unlock();
  if (!st.ok()) return st;
  return live;
}

namespace {

// /proc/<pid>/cmdline with its NULs as spaces; "" when it cannot be read.
std::string CommandLine(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

}  // namespace

Result<NodeLoaders> ReadNodeLoaders() {
  const std::vector<std::string> paths = NodeRegistry::DefaultPaths();
  if (paths.empty()) return Unavailable(TurnedOff());
  if (ChosenPath() != nullptr && paths.front().front() != '/') {
    return Unavailable(RelativeChosen(paths.front()));
  }
  NodeLoaders out;
  // Every table there is: a loader that could not use the first path is in a later one.
  for (const std::string& path : paths) {
    Result<std::vector<NodeLoader>> live = NodeRegistry::Read(path);
    if (!live.ok()) {
      // No file at a default path: no loader made one. At a chosen path, say so
      // (a typo there would look like an idle machine).
      if (live.status().code() != StatusCode::kNotFound || ChosenPath() != nullptr) {
        out.notes.push_back(live.status().message());
      }
      continue;
    }
    out.registries.push_back(path);
    for (const NodeLoader& l : *live) {
      NodeLoaderInfo i;
      i.pid = l.pid;
      i.loader_id = l.loader_id;
      i.local_rank = l.record.local_rank;
      i.tuned = l.record.tuned != 0;
      i.workers = l.record.workers;
      i.prefetch_batches = l.record.prefetch_batches;
      i.samples_per_s = l.record.samples_per_s;
      i.stall = l.record.stall;
      i.cpu_cores = l.record.cpu_cores;
      i.want_cores = l.record.want_cores;
      i.share_cores = l.record.share_cores;
      i.budget_cores = l.record.budget_cores;
      i.heartbeat_age_s = l.heartbeat_age_s;
      if (l.same_pid_namespace) i.command = CommandLine(l.pid);  // else its pid means another
      out.loaders.push_back(std::move(i));
    }
  }
  std::sort(out.loaders.begin(), out.loaders.end(),
            [](const NodeLoaderInfo& a, const NodeLoaderInfo& b) {
              return std::tie(a.pid, a.loader_id) < std::tie(b.pid, b.loader_id);
            });
  return out;
}

}  // namespace stoker
