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
  return Status::Ok();
}

// One batch buffer's bytes; nullopt when the product overflows.
std::optional<size_t> BatchBytes(const LoaderOptions& o) {
  size_t bytes = 0;
  if (__builtin_mul_overflow(ItemSpec(o).bytes(), static_cast<size_t>(o.batch_size), &bytes)) {
    return std::nullopt;
  }
  return bytes;
}

// The smallest working loader holds two batch buffers: one the consumer has,
// one being written. Past the budget, the engine's allocation fails or the
// kernel kills the process, with no word on which option asked for too much.
Status CheckBatchFits(const LoaderOptions& o, size_t budget) {
  const std::optional<size_t> batch = BatchBytes(o);
  if (batch && *batch <= budget / 2) return Status::Ok();
  const std::string budget_option =
      o.tuner.memory_budget_bytes == 0
          ? std::to_string(static_cast<int>(kMemoryBudgetShare * 100 + 0.5)) +
                " % of available memory, the default of tuner option 'memory_budget_bytes'"
          : "tuner option 'memory_budget_bytes' = " + std::to_string(o.tuner.memory_budget_bytes);
  return InvalidArgument("option 'batch_size' = " + std::to_string(o.batch_size) +
                         " makes one batch " +
                         (batch ? FormatBytes(*batch) : std::string("too large to count")) +
                         " (of the transform's samples, " + FormatBytes(ItemSpec(o).bytes()) +
                         " each); a loader needs room for two (one delivered, one being written), "
                         "more than the memory budget of " +
                         FormatBytes(budget) + " (" + budget_option + ")");
}

// Splits the budget (docs/engine.md, "Memory budget"): batch buffers first,
// the consumer's and the prefetch bound's, which is lowered to at most half
// the budget (but always one batch being written); the workers share the
// rest evenly as their per-sample cap.
// REQUIRES: CheckBatchFits(o, budget) is ok and o.workers >= 0.
SampleCap SplitBudget(LoaderOptions& o, size_t budget) {
  const size_t batch = *BatchBytes(o);
  const size_t room = std::max(budget / 2, 2 * batch) - batch;
  size_t prefetch = std::max(o.prefetch_bytes, batch);  // the engine's bound in bytes
  if (static_cast<size_t>(o.prefetch_batches) <= prefetch / batch) {
    prefetch = static_cast<size_t>(o.prefetch_batches) * batch;
  }
  if (prefetch > room) {
    prefetch = room;
    o.prefetch_bytes = room;
  }
  SampleCap cap;
  cap.budget_bytes = budget;
  cap.workers = std::max(o.workers, 1);
  cap.bytes = (budget - batch - prefetch) / static_cast<size_t>(cap.workers);
  return cap;
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
  STOKER_RETURN_IF_ERROR(CheckBatchFits(options, budget));
  if (!tuned) {
    const SampleCap cap = SplitBudget(options, budget);
    return MakeEngineLoader(std::move(options), nullptr, cap);
  }
  if (options.tuner.initial_workers > 0) {
    advice.workers = options.tuner.max_workers > 0
                         ? std::min(options.tuner.initial_workers, options.tuner.max_workers)
                         : options.tuner.initial_workers;
  }
  options.workers = advice.workers;
  options.prefetch_batches = advice.prefetch_batches;
  options.prefetch_bytes = std::max<size_t>(advice.prefetch_bytes, 1);
  const SampleCap cap = SplitBudget(options, budget);
  std::unique_ptr<Controller> tuner =
      MakeTuner(options.tuner, advice, facts, *BatchBytes(options), std::move(trace_writer));
  return MakeEngineLoader(std::move(options), std::move(tuner), cap);
}

}  // namespace stoker
