#include "source/label_text.h"

#include <optional>
#include <string>

#include "core/number_text.h"

namespace stoker {

std::string_view SkipByteOrderMark(std::string_view text) {
  constexpr std::string_view kBom = "\xEF\xBB\xBF";
  if (text.starts_with(kBom)) text.remove_prefix(kBom.size());
  return text;
}

Result<int64_t> ParseLabel(std::string_view text) {
  // A label is a line or a small member; garbage (a whole image in a .cls)
  // is shown by its start only.
  constexpr size_t kShown = 40;
  // (Built by appending: GCC 12 warns falsely on "'" + std::string.)
  std::string shown(1, '\'');
  shown.append(text.substr(0, kShown)).append(text.size() > kShown ? "...'" : "'");
  std::optional<int64_t> label = ParseInteger<int64_t>(text);
  if (!label) return DataError("label " + shown + " is not an integer");
  if (*label < 0) {
    return DataError("label " + shown + " is negative: a label is a class index, 0 or more");
  }
  return *label;
}

}  // namespace stoker
