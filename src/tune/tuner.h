#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "engine/controller.h"
#include "stoker/advisor.h"
#include "stoker/probe.h"
#include "stoker/tuning.h"
#include "tune/trace_writer.h"

namespace stoker {

/// The tuner that Loader::Make attaches to a loader made with workers ==
/// kAutoWorkers: a Controller that feeds the loader's metrics to a TunerCore
/// and applies its decisions. It starts from `advice` (the worker count and
/// prefetch bound the loader was made with, and the memory budget unless
/// options.memory_budget_bytes sets one) and the CPU budget in `facts`;
/// `batch_bytes` is one batch buffer; `item` names the engine's item in its
/// reasons and figures ("sample", or a kind's WorkerKind::item_name());
/// `processes`: each worker is a process (WorkerKind::workers_are_processes).
/// Decisions go to `trace_writer` too when it is not null. Tick runs on the
/// consumer's thread; View and Trace are safe from any thread.
std::unique_ptr<Controller> MakeTuner(TunerOptions options, const Advice& advice,
                                      const MachineFacts& facts, size_t batch_bytes,
                                      int64_t batch_items, std::string item, bool processes,
                                      std::unique_ptr<TraceWriter> trace_writer);

/// What Loader::Make attaches to a loader with a fixed worker count: a
/// Controller that only lists it in the node registry (its workers, rate,
/// stall), for `stoker monitor`; it changes nothing. `facts` gives its rank.
std::unique_ptr<Controller> MakeNodeListing(const MachineFacts& facts);

}  // namespace stoker
