#include "stoker/sample_cap.h"

#include "core/number_text.h"

namespace stoker {

Status SampleCap::Refuse(const std::string& what, uint64_t need, const std::string& before) const {
  std::string origin;
  if (budget_bytes > 0) {
    origin = " (the memory budget of " + FormatBytes(budget_bytes) +
             ", less the batch buffers, over " + std::to_string(workers) +
             (workers == 1 ? " worker)" : " workers)");
  }
  return ResourceExhausted(what + " needs " + FormatBytes(need) + " (" + std::to_string(need) +
                           " bytes), more than the per-sample cap of " + FormatBytes(bytes) +
                           origin + "; refused before " + before);
}

}  // namespace stoker
