#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include "stoker/loader.h"
#include "stoker/tuning.h"

namespace stoker {

/// Adjusts a loader while it runs (the tuner, attached by Loader::Make). The
/// loader calls Tick on the consumer's thread, from inside Next() (also while
/// Next() or WaitReady() waits), about every interval(), never under its own
/// lock; Tick may call the loader's Metrics, Resize and SetPrefetch.
/// View and Trace are called from any thread, concurrently with Tick (they
/// answer Loader::tuner_view and tuner_trace), so they must be thread-safe.
class Controller {
 public:
  virtual ~Controller() = default;
  virtual std::chrono::nanoseconds interval() const = 0;
  virtual void Tick(Loader& loader) = 0;
  /// The tuner's current picture; nullopt for a controller that is no tuner.
  virtual std::optional<TunerView> View() const { return std::nullopt; }
  /// Every decision so far, oldest first.
  virtual std::vector<TunerDecision> Trace() const { return {}; }
  /// Blocks until every decision so far is in the trace file, if any; the
  /// first error writing it, or Ok. Called from any thread.
  virtual Status FlushTrace() { return Status::Ok(); }
};

}  // namespace stoker
