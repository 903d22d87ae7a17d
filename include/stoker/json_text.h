#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>

namespace stoker {

/// `value` as JSON text: the one writer of every JSON text stoker emits (the
/// CLI's --json output and error objects, the tuner's trace lines, messages
/// that quote JSON). Call it instead of nlohmann::json::dump, which throws
/// (type_error 316) on a string that is not UTF-8.
///
/// The layout, numbers and escapes are dump(indent)'s, non-ASCII UTF-8 is
/// written as it is, and strings and object keys may hold any bytes: paths,
/// file and tar member names need not be UTF-8. Each byte that is not part
/// of a well-formed UTF-8 sequence is written as the escape "\udcXX", the
/// lone surrogate U+DC00 + byte, which is how Python's "surrogateescape"
/// error handler (os.fsdecode) decodes that byte. So the text is always
/// valid UTF-8, every valid string reads back unchanged, and the original
/// bytes are recoverable: in Python, os.fsencode(json.loads(text)["key"])
/// gives them back, and the str is the one stoker's Python bindings hand out
/// for the same key. Parsers that refuse lone surrogates (nlohmann's own,
/// Rust's serde_json) refuse a text that has one; a text without invalid
/// bytes is plain JSON for every parser.
///
/// `indent` < 0: one line, no spaces; otherwise a newline and `indent`
/// spaces per level, as dump(indent). Never throws except std::bad_alloc.
/// Thread-safe (a pure function).
std::string DumpJson(const nlohmann::json& value, int indent = -1);

/// `text` as XML character data (an SVG plot's title): & < > ' " escaped,
/// well-formed UTF-8 as it is, and control bytes and bytes outside UTF-8
/// (a path's) as the visible text \xNN, which XML cannot otherwise hold.
/// Thread-safe (a pure function).
std::string XmlText(std::string_view text);

}  // namespace stoker
