#pragma once

#include <memory>

#include "engine/controller.h"
#include "stoker/loader.h"
#include "stoker/status.h"

namespace stoker {

// The engine's half of Loader::Make. The factory itself lives in stoker_tune
// (src/tune/loader_factory.cc), which resolves kAutoWorkers through the
// advisor and builds the tuner; the engine cannot depend on either.

/// The shape of each of the loader's samples (or items, with a kind).
SampleSpec ItemSpec(const LoaderOptions& options);

/// Checks the options the engine reads (all but `tuner`); the error names the
/// option at fault. workers may be kAutoWorkers, which the factory resolves
/// before calling MakeEngineLoader.
Status ValidateEngineOptions(const LoaderOptions& options);

/// The loader of `options`, ticking `controller` (null: none) from inside
/// Next(). The controller is attached before the loader is returned and never
/// replaced, so the loader may read it from any thread. Every worker (and the
/// consumer's thread) hands `cap` to its ReadBuffer and TransformScratch and
/// keeps their footprint within it (docs/engine.md, "Memory budget").
/// Errors when the system refuses a worker thread.
/// REQUIRES: ValidateEngineOptions(options) is ok and options.workers >= 0.
Result<std::unique_ptr<Loader>> MakeEngineLoader(LoaderOptions options,
                                                 std::unique_ptr<Controller> controller,
                                                 const SampleCap& cap);

}  // namespace stoker
