#include "source/label_text.h"

#include <algorithm>
#include <limits>
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
  if (!label) {
    const std::string_view digits = text.starts_with('-') ? text.substr(1) : text;
    const bool integer = !digits.empty() && std::all_of(digits.begin(), digits.end(), [](char c) {
      return c >= '0' && c <= '9';
    });
    if (integer && !text.starts_with('-')) {
      return DataError("label " + shown + " is out of range: a class index is at most " +
                       std::to_string(std::numeric_limits<int64_t>::max()));
    }
    if (!integer) return DataError("label " + shown + " is not an integer");
  }
  if (!label) label = -1;  // an integer below int64's range: negative all the same
  if (*label < 0) {
    return DataError("label " + shown + " is negative: a label is a class index, 0 or more");
  }
  return *label;
}

}  // namespace stoker
