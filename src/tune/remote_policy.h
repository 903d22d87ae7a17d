#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace stoker {

/// One tick's window, as the remote policy reads it.
struct RemoteWindow {
  double window_s = 0;
  int64_t batches = 0;         // delivered
  double wait_s = 0;           // the consumer's time inside Next()
  double step_s = 0;           // and between Next() calls
  int64_t remote_batches = 0;  // made on remote slots
};

/// Where the loader stands when a window ends.
struct RemoteContext {
  int local_workers = 0;     // the local pool the TunerCore keeps
  bool local_spent = false;  // it cannot grow: the local CPU budget (or max_workers) is spent
  int capacity = 0;          // remote slots the cluster offers now
  int remote = 0;            // remote slots in use
  int memory_cap = -1;       // remote slots whose batches the memory budget holds (-1: any)
};

struct RemoteDecision {
  int remote_after = 0;
  std::string reason;
};

/// The numbers behind RemotePolicy's decisions (docs/remote.md says why).
struct RemoteParams {
  double min_window_s = 1.5;  // pool windows until they cover this much time ...
  int64_t min_batches = 8;    // ... and this many batches ...
  double max_window_s = 5.0;  // ... unless this much time has passed
  // After slots were added, windows are not judged until each new slot
  // delivered a batch (its worker's start-up: the job arriving, imports) and
  // settle_s passed, or max_settle_s passed.
  double settle_s = 0.5;
  double max_settle_s = 10.0;
  double stall_high = 0.05;  // the consumer waits too much above this share of the time
  double stall_low = 0.01;   // it is fed with margin below this
  // A step up pays when the consumer no longer waits, or when it adds this
  // much throughput and at least half of what its slots would at the rate
  // of the workers already there.
  double gain = 0.05;
  double change = 0.3;  // a rate change this large is a new workload (marks cleared)
};

/// How many remote slots a loader borrows, local first: none while the local
/// pool can still grow or the consumer does not wait; when the local CPU
/// budget is spent and the consumer waits, the slots Little's law says would
/// feed it (its demand over the local pool's rate per worker); then steps up
/// by half while a step pays (RemoteParams::gain), each judged once its new
/// slots delivered, back and a knee mark when one does not; steps
/// down by one while the consumer never waits, back and a floor mark when
/// that starves it; never more than the cluster offers. A rate change of
/// `change` clears the marks. Deterministic and free of clocks: tests drive
/// it with windows. Not thread-safe.
class RemotePolicy {
 public:
  explicit RemotePolicy(RemoteParams params = {}) : p_(params) {}

  /// Feeds one window; a decision when the remote slots should change.
  std::optional<RemoteDecision> Observe(const RemoteWindow& w, const RemoteContext& c);

 private:
  enum class Trial { kNone, kUp, kDown };
  std::optional<RemoteDecision> Judge(double rate, double stall, double demand,
                                      const RemoteContext& c);
  std::optional<RemoteDecision> Change(int from, int to, Trial trial, double rate,
                                       std::string reason);

  RemoteParams p_;
  RemoteWindow pooled_;
  double since_change_s_ = 1e9;  // time since the last change
  int capacity_ = -1;            // the cluster's slots at the last window
  bool started_ = false;         // a batch was delivered (the pipeline filled)
  int64_t awaited_ = 0;          // remote batches to see before judging (new slots' first)
  Trial trial_ = Trial::kNone;
  int before_ = 0;          // slots before the step on trial
  double base_rate_ = 0;    // the rate that step is judged against
  double knee_rate_ = -1;   // the rate at a knee (a step up paid nothing); < 0: none
  double floor_rate_ = -1;  // the rate at a floor (a step down starved it); < 0: none
};

}  // namespace stoker
