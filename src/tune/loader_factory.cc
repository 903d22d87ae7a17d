// Loader::Make, the one factory of loaders. It lives here rather than in the
// engine because resolving kAutoWorkers needs the advisor and the tuner,
// which sit above the engine (stoker_tune depends on stoker_engine).

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>

#include "core/number_text.h"
#include "engine/engine_loader.h"
#include "stoker/advisor.h"
#include "stoker/defaults.h"
#include "stoker/loader.h"
#include "stoker/probe.h"
#include "tune/trace_writer.h"
#include "tune/tuner.h"

namespace stoker {
namespace {

// Checked whatever the worker count, so that a mistake shows before the
// options are used with workers = auto.
Status ValidateTunerOptions(const LoaderOptions& o) {
  const TunerOptions& t = o.tuner;
  if (!std::isfinite(t.interval_s) || t.interval_s <= 0) {
    return InvalidArgument(
        "tuner option 'interval_s' must be a finite number of seconds > 0, got " +
        FormatNumber(t.interval_s));
  }
  if (t.initial_workers < 0 || t.initial_workers > kMaxWorkers) {
    return InvalidArgument("tuner option 'initial_workers' must be in [0, " +
                           std::to_string(kMaxWorkers) + "] (0 = the advisor's), got " +
                           std::to_string(t.initial_workers));
  }
  if (t.max_workers < 0 || t.max_workers > kMaxWorkers) {
    return InvalidArgument("tuner option 'max_workers' must be in [0, " +
                           std::to_string(kMaxWorkers) + "] (0 = from the machine), got " +
                           std::to_string(t.max_workers));
  }
  if (t.remote_min < 0 || t.remote_min > kMaxWorkers) {
    return InvalidArgument("tuner option 'remote_min' must be in [0, " +
                           std::to_string(kMaxWorkers) + "], got " + std::to_string(t.remote_min));
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Loader>> Loader::Make(LoaderOptions options) {
  STOKER_RETURN_IF_ERROR(ValidateEngineOptions(options));
  STOKER_RETURN_IF_ERROR(ValidateTunerOptions(options));
  const bool tuned = options.workers == kAutoWorkers;
  // An unwritable trace path fails here, not silently later.
  std::unique_ptr<TraceWriter> trace_writer;
  if (tuned && !options.tuner.trace_path.empty()) {
    STOKER_ASSIGN_OR_RETURN(trace_writer, TraceWriter::Open(options.tuner.trace_path));
  }
  // The one budget, resolved once, whatever the worker count.
  size_t budget = options.tuner.memory_budget_bytes;
  MachineFacts facts;
  Advice advice;
  if (tuned || budget == 0) {
    ProbeOptions po;
    po.skip_gpus = true;
    facts = ProbeMachine(po);
    AdviseInputs in;
    in.batch_size = options.batch_size;
    in.sample_bytes = ItemSpec(options).bytes();
    advice = Advise(facts, in);
    if (budget == 0) budget = advice.memory_budget_bytes;
    advice.memory_budget_bytes = budget;
  }
  // Before the tuner is made (it joins the node's registry).
  STOKER_RETURN_IF_ERROR(CheckBatchFits(options, budget));
  if (!tuned) return MakeEngineLoader(std::move(options), budget, MakeNodeListing(facts));
  if (options.tuner.initial_workers > 0) {
    advice.workers = options.tuner.max_workers > 0
                         ? std::min(options.tuner.initial_workers, options.tuner.max_workers)
                         : options.tuner.initial_workers;
  }
  options.workers = advice.workers;
  options.prefetch_batches = advice.prefetch_batches;
  options.prefetch_bytes = std::max<size_t>(advice.prefetch_bytes, 1);
  // The tuner's unit: a sample of a Source, or a kind's item (a whole user
  // batch for stoker.DataLoader's kinds), so that its reasons say which.
  std::string item = options.kind != nullptr ? options.kind->item_name() : "sample";
  const bool processes = options.kind != nullptr && options.kind->workers_are_processes();
  std::unique_ptr<Controller> tuner =
      MakeTuner(options.tuner, advice, facts, *BatchBytes(options), options.batch_size,
                std::move(item), processes, std::move(trace_writer));
  return MakeEngineLoader(std::move(options), budget, std::move(tuner));
}

}  // namespace stoker
