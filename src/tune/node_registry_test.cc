// The node registry: loaders on one machine see each other's entries; an
// entry whose loader stops publishing, or whose process died (killed with
// SIGKILL, reaped or not), is freed within seconds; a full table and a file
// of something else are errors naming the path.

#include "tune/node_registry.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "stoker/tuning.h"
#include "testing/source_test_util.h"

namespace stoker {
namespace {

std::unique_ptr<NodeRegistry> OpenOrDie(const std::string& path, NodeRegistryOptions o = {}) {
  auto r = NodeRegistry::Open(path, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(*r) : nullptr;
}

NodeLoaderRecord Record(int workers, double want) {
  NodeLoaderRecord r;
  r.workers = workers;
  r.want_cores = want;
  r.cpu_cores = 0.5;
  r.budget_cores = 2;
  r.domain = 7;
  return r;
}

// The live loaders `reader` sees, by (pid, loader id).
std::vector<NodeLoader> Live(NodeRegistry& reader) {
  auto r = reader.Publish(Record(1, 1));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : std::vector<NodeLoader>{};
}

bool Lists(const std::vector<NodeLoader>& live, pid_t pid) {
  for (const NodeLoader& l : live) {
    if (l.pid == pid && !l.self) return true;
  }
  return false;
}

// Polls `done` for up to `limit` (a generous bound for a loaded machine).
bool WaitFor(const std::function<bool()>& done,
             std::chrono::seconds limit = std::chrono::seconds(20)) {
  const auto start = std::chrono::steady_clock::now();
  while (!done()) {
    if (std::chrono::steady_clock::now() - start > limit) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST(NodeRegistryTest, LoadersSeeEachOthersRecords) {
  testing::TempDir dir;
  auto a = OpenOrDie(dir / "reg");
  auto b = OpenOrDie(dir / "reg");
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->loader_id(), b->loader_id());
  auto first = a->Publish(Record(3, 1.5));
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_EQ(first->size(), 1u);
  EXPECT_TRUE((*first)[0].self);
  auto both = b->Publish(Record(5, std::numeric_limits<double>::infinity()));
  ASSERT_TRUE(both.ok()) << both.status().ToString();
  ASSERT_EQ(both->size(), 2u);
  int selves = 0;
  for (const NodeLoader& l : *both) {
    EXPECT_EQ(l.pid, ::getpid());
    EXPECT_EQ(l.record.domain, 7u);
    EXPECT_GE(l.heartbeat_age_s, 0);
    if (l.self) {
      ++selves;
      EXPECT_EQ(l.loader_id, b->loader_id());
      EXPECT_EQ(l.record.workers, 5);
      EXPECT_TRUE(std::isinf(l.record.want_cores));
    } else {
      EXPECT_EQ(l.loader_id, a->loader_id());
      EXPECT_EQ(l.record.workers, 3);
      EXPECT_EQ(l.record.want_cores, 1.5);
    }
  }
  EXPECT_EQ(selves, 1);
  // A loader publishes into its own entry again: still two.
  auto again = a->Publish(Record(4, 1.5));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->size(), 2u);
  // A destroyed loader's entry is freed at once.
  a.reset();
  auto alone = b->Publish(Record(5, 1));
  ASSERT_TRUE(alone.ok());
  ASSERT_EQ(alone->size(), 1u);
  EXPECT_TRUE((*alone)[0].self);
}

// A loader that stops publishing (its process stopped or hung) loses its
// entry after stale_s, and takes one again when it publishes next.
TEST(NodeRegistryTest, StaleEntryIsFreedAndRetakenOnTheNextHeartbeat) {
  testing::TempDir dir;
  NodeRegistryOptions quick;
  quick.stale_s = 0.2;
  auto quiet = OpenOrDie(dir / "reg", quick);
  auto reader = OpenOrDie(dir / "reg", quick);
  ASSERT_TRUE(quiet && reader);
  ASSERT_TRUE(quiet->Publish(Record(2, 1)).ok());
  auto count = [&] { return Live(*reader).size(); };
  // Published just now (the heartbeat is fresh): listed.
  ASSERT_TRUE(quiet->Publish(Record(2, 1)).ok());
  EXPECT_EQ(count(), 2u);
  EXPECT_TRUE(WaitFor([&] { return count() == 1; })) << "stale entry never freed";
  auto back = quiet->Publish(Record(2, 1));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->size(), 2u);
}

// A child process that registers, then waits; returns its pid once its
// entry is in the table. The child never returns.
pid_t RegisteredChild(const std::string& path) {
  int ready[2];
  if (::pipe(ready) != 0) return -1;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(ready[0]);
    auto r = NodeRegistry::Open(path);
    const bool ok = r.ok() && (*r)->Publish(Record(8, 1)).ok();
    const char byte = ok ? 1 : 0;
    if (::write(ready[1], &byte, 1) != 1) ::_exit(1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  const bool ok = pid > 0 && ::read(ready[0], &byte, 1) == 1 && byte == 1;
  ::close(ready[0]);
  if (!ok && pid > 0) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return -1;
  }
  return pid;
}

// A rank killed with SIGKILL loses its entry within seconds, by the process
// check alone (stale_s is far longer here): as a zombie, not yet reaped, and
// once reaped.
TEST(NodeRegistryTest, KilledProcessLosesItsEntryWithinSeconds) {
  testing::TempDir dir;
  NodeRegistryOptions slow_stale;
  slow_stale.stale_s = 3600;
  auto reader = OpenOrDie(dir / "reg", slow_stale);
  ASSERT_TRUE(reader);
  for (const bool reap : {false, true}) {
    const pid_t child = RegisteredChild(dir / "reg");
    ASSERT_GT(child, 0) << "the child could not register";
    EXPECT_TRUE(Lists(Live(*reader), child));
    ASSERT_EQ(::kill(child, SIGKILL), 0);
    if (reap) {
      ASSERT_EQ(::waitpid(child, nullptr, 0), child);
    }
    EXPECT_TRUE(WaitFor([&] { return !Lists(Live(*reader), child); }))
        << "the killed child's entry stayed (reaped: " << reap << ")";
    if (!reap) ::waitpid(child, nullptr, 0);
  }
}

TEST(NodeRegistryTest, FullTableIsAnErrorNamingThePath) {
  testing::TempDir dir;
  const std::string path = dir / "reg";
  std::vector<std::unique_ptr<NodeRegistry>> handles;
  for (int i = 0; i < NodeRegistry::kEntries; ++i) {
    handles.push_back(OpenOrDie(path));
    ASSERT_TRUE(handles.back());
    ASSERT_TRUE(handles.back()->Publish(Record(1, 1)).ok()) << i;
  }
  auto one_more = OpenOrDie(path);
  ASSERT_TRUE(one_more);
  auto r = one_more->Publish(Record(1, 1));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  handles.pop_back();  // frees an entry
  EXPECT_TRUE(one_more->Publish(Record(1, 1)).ok());
}

TEST(NodeRegistryTest, AFileOfSomethingElseIsRefusedByName) {
  testing::TempDir dir;
  const std::string path = dir / "other";
  ASSERT_TRUE(testing::WriteFile(path, "not a registry"));
  auto r = NodeRegistry::Open(path);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  EXPECT_EQ(testing::ReadFile(path), "not a registry");  // left as it was
}

TEST(NodeRegistryTest, ProcessStartTellsALiveProcessFromAGoneOne) {
  const std::optional<ProcessStart> self = ReadProcessStart(::getpid());
  ASSERT_TRUE(self.has_value());
  EXPECT_GT(self->ticks, 0u);
  EXPECT_FALSE(self->zombie);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);
  EXPECT_FALSE(ReadProcessStart(child).has_value());
}

// Another process may truncate or rewrite the file at any moment: the next
// call is refused by name, never a SIGBUS (nothing is mapped).
TEST(NodeRegistryTest, AFileTruncatedUnderALiveLoaderIsRefusedNotACrash) {
  testing::TempDir dir;
  const std::string path = dir / "registry";
  auto reg = OpenOrDie(path);
  ASSERT_TRUE(reg);
  ASSERT_TRUE(reg->Publish(Record(2, 2)).ok());
  for (off_t size : {off_t{0}, off_t{100}, off_t{1} << 20}) {
    ASSERT_EQ(::truncate(path.c_str(), size), 0);
    auto r = reg->Publish(Record(2, 2));
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  }
  reg.reset();  // its destructor reads the file too
}

// A hard link to a registry file would pass the owner check on another name.
TEST(NodeRegistryTest, AFileWithTwoLinksIsRefused) {
  testing::TempDir dir;
  const std::string path = dir / "registry";
  ASSERT_TRUE(OpenOrDie(path));
  ASSERT_EQ(::link(path.c_str(), (dir / "planted").c_str()), 0);
  for (const std::string& name : {path, dir / "planted"}) {
    auto r = NodeRegistry::Open(name);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.status().message().find("one link"), std::string::npos) << r.status().message();
  }
}

// An entry whose heartbeat lies ahead of the reader's clock (forged, or a
// clock set back) is judged by the reader's clock: freed, not live forever.
TEST(NodeRegistryTest, AnEntryFromTheFutureIsFreed) {
  testing::TempDir dir;
  const std::string path = dir / "registry";
  NodeRegistryOptions quick;
  quick.stale_s = 0.5;
  auto other = OpenOrDie(path, quick);
  auto reader = OpenOrDie(path, quick);
  ASSERT_TRUE(other && reader);
  ASSERT_TRUE(other->Publish(Record(3, 3)).ok());
  // The first entry's heartbeat (after the 24-byte header and its token): an hour ahead.
  const int64_t future =
      std::chrono::duration_cast<std::chrono::nanoseconds>(
          std::chrono::system_clock::now().time_since_epoch() + std::chrono::hours(1))
          .count();
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  ASSERT_EQ(::pwrite(fd.get(), &future, sizeof future, 24 + 8),
            static_cast<ssize_t>(sizeof future));
  const std::vector<NodeLoader> live = Live(*reader);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_TRUE(live[0].self);
}

// $STOKER_NODE_REGISTRY picks the file, or turns the registry off (the
// loader then behaves as it did without one, and says why).
TEST(NodeRegistryTest, EnvironmentChoosesOrTurnsOffTheRegistry) {
  const char* before = std::getenv("STOKER_NODE_REGISTRY");
  const std::optional<std::string> saved =
      before ? std::optional<std::string>(before) : std::nullopt;
  testing::TempDir dir;
  ::setenv("STOKER_NODE_REGISTRY", (dir / "chosen").c_str(), 1);
  EXPECT_EQ(NodeRegistry::DefaultPaths(), std::vector<std::string>{dir / "chosen"});
  auto chosen = NodeRegistry::OpenDefault();
  ASSERT_TRUE(chosen.ok()) << chosen.status().ToString();
  EXPECT_EQ((*chosen)->path(), dir / "chosen");
  ::setenv("STOKER_NODE_REGISTRY", "off", 1);
  EXPECT_TRUE(NodeRegistry::DefaultPaths().empty());
  auto off = NodeRegistry::OpenDefault();
  ASSERT_FALSE(off.ok());
  EXPECT_NE(off.status().message().find("STOKER_NODE_REGISTRY"), std::string::npos);
  ::setenv("STOKER_NODE_REGISTRY", "OFF", 1);
  EXPECT_TRUE(NodeRegistry::DefaultPaths().empty());
  // Relative: loaders started in other folders would not meet.
  ::setenv("STOKER_NODE_REGISTRY", "reg", 1);
  auto relative = NodeRegistry::OpenDefault();
  ASSERT_FALSE(relative.ok());
  EXPECT_NE(relative.status().message().find("not an absolute path"), std::string::npos);
  EXPECT_FALSE(ReadNodeLoaders().ok());
  ::setenv("STOKER_NODE_REGISTRY", "", 1);  // empty: the defaults, as unset
  EXPECT_EQ(NodeRegistry::DefaultPaths().front().rfind("/dev/shm/", 0), 0u);
  ::unsetenv("STOKER_NODE_REGISTRY");
  const std::vector<std::string> defaults = NodeRegistry::DefaultPaths();
  ASSERT_FALSE(defaults.empty());
  EXPECT_EQ(defaults.front().rfind("/dev/shm/", 0), 0u);
  if (saved) ::setenv("STOKER_NODE_REGISTRY", saved->c_str(), 1);
}

}  // namespace
// The monitor's read: the live entries, with nothing written (no entry
// taken, so a full table stays full and no heartbeat is refreshed); a
// missing file is NotFound, a file of something else an error naming it.
TEST(NodeRegistryTest, ReadListsTheLiveLoadersWithoutJoining) {
  testing::TempDir dir;
  const std::string path = dir / "reg";
  auto missing = NodeRegistry::Read(path);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  NodeRegistryOptions quick;
  quick.stale_s = 0.3;
  auto a = OpenOrDie(path, quick);
  ASSERT_NE(a, nullptr);
  NodeLoaderRecord r = Record(5, 2);
  r.samples_per_s = 1234;
  r.prefetch_batches = 7;
  r.tuned = 0;
  ASSERT_TRUE(a->Publish(r).ok());
  const std::string before = testing::ReadFile(path);
  auto read = NodeRegistry::Read(path, quick);
  ASSERT_TRUE(read.ok()) << read.status().ToString();
  ASSERT_EQ(read->size(), 1u);
  EXPECT_EQ((*read)[0].pid, ::getpid());
  EXPECT_EQ((*read)[0].loader_id, a->loader_id());
  EXPECT_EQ((*read)[0].record.workers, 5);
  EXPECT_EQ((*read)[0].record.prefetch_batches, 7);
  EXPECT_DOUBLE_EQ((*read)[0].record.samples_per_s, 1234);
  EXPECT_EQ((*read)[0].record.tuned, 0);
  EXPECT_FALSE((*read)[0].self);
  EXPECT_EQ(testing::ReadFile(path), before);  // nothing written
  // Once its heartbeat is stale, it is no longer listed.
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  read = NodeRegistry::Read(path, quick);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->empty());
  const std::string other = dir / "other";
  ASSERT_TRUE(testing::WriteFile(other, std::string(100, 'x')));
  auto bad = NodeRegistry::Read(other);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(other), std::string::npos);
}

}  // namespace stoker
