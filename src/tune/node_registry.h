#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/unique_fd.h"
#include "stoker/status.h"

namespace stoker {

/// What one loader tells the others on its machine (docs/tuner.md, "Loaders
/// sharing a node").
struct NodeLoaderRecord {
  int local_rank = -1;      // LOCAL_RANK when the launcher set it; -1 otherwise
  int workers = 0;          // its worker count now
  double cpu_cores = 0;     // its workers' CPU use, cores, over the last second or so
  double stall = 0;         // the share of time its consumer waited for data, recently
  double want_cores = 0;    // its need: the cores it would use; +inf: data-bound
  double budget_cores = 0;  // the node's CPU budget as its probe reads it
  uint64_t domain = 0;      // the CPUs it may run on (a hash of its affinity mask)
  // For `stoker monitor`; not read by the split.
  double samples_per_s = 0;  // the user's samples delivered, recently
  double share_cores = 0;    // its share of the budget at its last tick
  int32_t prefetch_batches = 0;
  int32_t tuned = 1;  // 0: a fixed worker count, listed only (no need, no share)
};

/// A live loader as the registry lists it.
struct NodeLoader {
  NodeLoaderRecord record;
  pid_t pid = 0;
  uint64_t loader_id = 0;          // unique within its process
  double heartbeat_age_s = 0;      // since it last published
  bool self = false;               // the loader that read the list
  bool same_pid_namespace = true;  // its pid names a process of the reader's namespace
};

/// Tunables of the registry; tests shorten them.
struct NodeRegistryOptions {
  /// An entry whose loader has not published for this long is free to take:
  /// its process is stopped, hung, or gone.
  double stale_s = 2.0;
  /// Entries older than this are checked for a dead process (pid gone, a
  /// zombie, or another process under the same pid) and freed at once.
  double check_pid_after_s = 0.5;
};

/// One loader's handle on the node registry: a small table in a shared file
/// (fixed size, kEntries entries, read and written whole under the lock) in
/// which each live loader keeps one entry, so that loaders of the local ranks
/// (or any loaders on the machine) see each other's workers, CPU and need.
///
/// Writes and reads take a non-blocking OFD byte-range lock on the file (the
/// kernel drops it when its holder dies, so a crashed loader never wedges the
/// others); when it cannot be had within a few milliseconds the call gives
/// up (kUnavailable) rather than block the consumer. An entry is free when
/// its process is gone (pid absent, a zombie, or a process with another
/// start time: a reused pid) or its heartbeat is older than stale_s.
///
/// Not thread-safe: one caller at a time (the tuner's tick). Nothing is
/// mapped: a file truncated or rewritten by another process is refused by
/// the next call (kUnavailable), never a SIGBUS.
class NodeRegistry {
 public:
  static constexpr int kEntries = 64;

  /// Opens (creating if needed, mode 0600) the table at `path`. Errors name
  /// the path: it cannot be created or mapped, or holds something else.
  /// A lock that stays busy while it opens is kUnavailable with `*busy`
  /// set (a passing holder: worth trying the same path again later).
  static Result<std::unique_ptr<NodeRegistry>> Open(const std::string& path,
                                                    NodeRegistryOptions options = {},
                                                    bool* busy = nullptr);

  /// Where the default table lives, in the order tried: $STOKER_NODE_REGISTRY
  /// when set and not empty ("off" in any case: none; a relative path is
  /// refused by OpenDefault and ReadNodeLoaders), else node-v<layout version> in a folder
  /// stoker-<uid> (made 0700, and refused unless only this user can write
  /// it) of /dev/shm, then $XDG_RUNTIME_DIR/stoker-node-v<version>, then in
  /// stoker-<uid> of /tmp. Per user: loaders of other users do not see it.
  static std::vector<std::string> DefaultPaths();
  /// The live loaders in the table at `path`, read without joining it (a
  /// shared lock, nothing written, no entry taken): `stoker monitor`. NotFound
  /// when there is no file; other errors as Open's.
  static Result<std::vector<NodeLoader>> Read(const std::string& path,
                                              NodeRegistryOptions options = {});

  /// Opens the first default path that works; the error (none is usable, or
  /// the registry is turned off) names each path and why. A path whose lock
  /// is busy ends the search (the loaders there must not be split from by
  /// a later path): `*busy` is set, and it is worth trying again later.
  static Result<std::unique_ptr<NodeRegistry>> OpenDefault(bool* busy = nullptr);

  /// Frees this loader's entry (if it still holds it).
  ~NodeRegistry();
  NodeRegistry(const NodeRegistry&) = delete;
  NodeRegistry& operator=(const NodeRegistry&) = delete;

  /// Publishes `record` with a fresh heartbeat, taking an entry the first
  /// time (and again if its entry was taken as stale), and returns every
  /// live loader's record, this one's included. Frees dead entries it finds.
  /// Errors: kUnavailable when the lock was busy or the table is full
  /// (naming the path); the caller keeps its last picture.
  Result<std::vector<NodeLoader>> Publish(const NodeLoaderRecord& record);

  const std::string& path() const { return path_; }
  /// Whether the file it holds is no longer the one at path() (removed, or
  /// replaced): new loaders would register apart from this one.
  bool Detached() const;
  /// Whether the file it holds no longer has a table's size and header
  /// (truncated or overwritten by another process): Publish fails until it
  /// is opened again (Open initialises an emptied file, refuses another).
  bool Damaged() const;
  uint64_t loader_id() const { return loader_id_; }

 private:
  struct Table;
  NodeRegistry(std::string path, UniqueFd fd, std::unique_ptr<Table> table,
               NodeRegistryOptions options);
  static bool HeaderFits(const Table& table);
  // The file into table_, and back; under the lock. Load fails (kUnavailable)
  // when the file changed size or header under us.
  Status Load();
  Status Store();
  // Takes and drops the lock on the whole file; Lock fails rather than wait.
  Status Lock();
  void Unlock();
  // The index of this loader's entry, or -1 (never taken, or taken from it).
  int FindOwn() const;
  bool Live(int index, int64_t now_ns) const;

  const std::string path_;
  const UniqueFd fd_;
  const std::unique_ptr<Table> table_;  // this handle's copy of the file
  const NodeRegistryOptions options_;
  const uint64_t loader_id_;
  const uint64_t token_;  // tells this loader's entry from any other's
  const uint64_t start_ticks_;
  const uint64_t pid_ns_;
  const pid_t pid_;
};

/// The start time of process `pid` in clock ticks since boot (field 22 of
/// /proc/<pid>/stat), with whether it is a zombie; nullopt when there is no
/// such process or /proc cannot tell.
struct ProcessStart {
  uint64_t ticks = 0;
  bool zombie = false;
};
std::optional<ProcessStart> ReadProcessStart(pid_t pid);

}  // namespace stoker
