#pragma once

#include <cstddef>
#include <memory>
#include <optional>

#include "engine/controller.h"
#include "stoker/loader.h"
#include "stoker/status.h"

namespace stoker {

// The engine's half of Loader::Make: a loader of a fixed worker count within
// a memory budget already resolved. The factory itself lives in stoker_tune
// (src/tune/loader_factory.cc), which resolves kAutoWorkers and the default
// budget through the advisor and builds the tuner; the engine cannot depend
// on either. The engine's own tests make their loaders here.

/// The shape of each of the loader's samples (or items, with a kind).
SampleSpec ItemSpec(const LoaderOptions& options);

/// One batch buffer's bytes; nullopt when the product overflows.
std::optional<size_t> BatchBytes(const LoaderOptions& options);

/// Checks the options the engine reads (all but `tuner`); the error names the
/// option at fault. workers may be kAutoWorkers, which the factory resolves
/// before calling MakeEngineLoader.
Status ValidateEngineOptions(const LoaderOptions& options);

/// kInvalidArgument, naming batch_size, the sample's bytes, the budget and
/// the budget's option (tuner.memory_budget_name), unless two batch buffers
/// (one delivered, one being written) fit in `budget_bytes`.
Status CheckBatchFits(const LoaderOptions& options, size_t budget_bytes);

/// The loader of `options` within `budget_bytes`, ticking `controller`
/// (null: none) from inside Next(). Checks the options (ValidateEngineOptions,
/// CheckBatchFits), lowers prefetch_bytes to at most half the budget, and
/// hands each worker (and the consumer's thread) what the batch buffers leave,
/// divided by the worker count, as the cap of its ReadBuffer and
/// TransformScratch (docs/engine.md, "Memory budget"). The controller is
/// attached before the loader is returned and never replaced, so the loader
/// may read it from any thread. Errors when the system refuses a worker thread.
/// REQUIRES: options.workers is not kAutoWorkers.
Result<std::unique_ptr<Loader>> MakeEngineLoader(LoaderOptions options, size_t budget_bytes,
                                                 std::unique_ptr<Controller> controller);

}  // namespace stoker
