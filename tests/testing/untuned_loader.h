#pragma once

// Loaders from the engine's own factory, for the engine's tests: they do not
// link stoker_tune, which defines Loader::Make.

#include <cstddef>
#include <memory>

#include "engine/engine_loader.h"
#include "stoker/loader.h"
#include "testing/loader_harness.h"

namespace stoker::testing {

/// The memory budget of MakeUntuned's loaders when the options set none
/// (Loader::Make's default is the advisor's share of available memory).
inline constexpr size_t kUntunedBudget = size_t{1} << 30;

/// The engine's own loader of `o` (MakeEngineLoader: no advisor, no tuner;
/// workers must be a count), within o.tuner.memory_budget_bytes or else
/// kUntunedBudget.
inline Result<std::unique_ptr<Loader>> MakeUntuned(const LoaderOptions& o) {
  const size_t budget =
      o.tuner.memory_budget_bytes != 0 ? o.tuner.memory_budget_bytes : kUntunedBudget;
  return MakeEngineLoader(o, budget, nullptr);
}

inline std::unique_ptr<Loader> MakeUntunedLoader(const LoaderOptions& o) {
  return Checked(MakeUntuned(o));
}

}  // namespace stoker::testing
