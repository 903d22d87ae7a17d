#pragma once

#include <cstdint>
#include <string_view>

#include "stoker/status.h"

// Labels and text in the files users hand stoker: list files (path<TAB>label)
// and the .cls members of tar shards. One parser, so that every reader takes
// and refuses the same labels.

namespace stoker {

/// `text` without the UTF-8 byte-order mark (EF BB BF) that some editors put
/// at the start of a text file, so that the mark never becomes part of the
/// first path or label; any other text is returned unchanged. Pure.
std::string_view SkipByteOrderMark(std::string_view text);

/// The class index `text` spells: a decimal integer from 0 to INT64_MAX that
/// fills all of `text` (callers trim it first). Errors (DataError, naming
/// the text, shortened, but not where it came from: callers add the file and
/// line or member): not an integer; a negative number, since a label indexes
/// a class. Pure.
Result<int64_t> ParseLabel(std::string_view text);

}  // namespace stoker
