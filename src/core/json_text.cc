#include "stoker/json_text.h"

#include <nlohmann/json.hpp>
#include <string_view>

namespace stoker {
namespace {

constexpr char kHex[] = "0123456789abcdef";

bool Continuation(unsigned char c, unsigned char lo = 0x80, unsigned char hi = 0xBF) {
  return c >= lo && c <= hi;
}

// Length of the well-formed UTF-8 sequence that starts `s` at `i` (Unicode's
// Table 3-7: no overlong forms, no surrogates, nothing above U+10FFFF), or 0
// when the byte there starts none. nlohmann's strict check accepts the same.
size_t Utf8Length(std::string_view s, size_t i) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = at(0);
  const size_t left = s.size() - i;
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return left >= 2 && Continuation(at(1)) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80;
    const unsigned char hi = c == 0xED ? 0x9F : 0xBF;
    return left >= 3 && Continuation(at(1), lo, hi) && Continuation(at(2)) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    const unsigned char lo = c == 0xF0 ? 0x90 : 0x80;
    const unsigned char hi = c == 0xF4 ? 0x8F : 0xBF;
    return left >= 4 && Continuation(at(1), lo, hi) && Continuation(at(2)) && Continuation(at(3))
               ? 4
               : 0;
  }
  return 0;
}

// A string literal with dump()'s escapes, invalid bytes as \udcXX.
void WriteString(std::string_view s, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const size_t n = Utf8Length(s, i);
    if (n == 0) {
      out += "\\udc";
      out += kHex[c >> 4];
      out += kHex[c & 0xF];
      ++i;
      continue;
    }
    if (n > 1) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          out += "\\u00";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
    ++i;
  }
  out += '"';
}

// Mirrors nlohmann's serializer for objects and arrays so that a tree of
// valid strings comes out byte for byte as dump(indent) writes it; scalars
// other than strings are dump()'s own.
void Write(const nlohmann::json& value, int indent, int level, std::string& out) {
  const bool pretty = indent >= 0;
  const bool object = value.is_object();
  if (value.is_string()) {
    WriteString(value.get_ref<const std::string&>(), out);
    return;
  }
  if (!object && !value.is_array()) {
    out += value.dump();
    return;
  }
  if (value.empty()) {
    out += object ? "{}" : "[]";
    return;
  }
  out += object ? '{' : '[';
  const std::string inner =
      pretty ? std::string(static_cast<size_t>(indent) * (level + 1), ' ') : std::string();
  bool first = true;
  for (auto it = value.begin(); it != value.end(); ++it) {
    if (!first) out += ',';
    first = false;
    if (pretty) {
      out += '\n';
      out += inner;
    }
    if (object) {
      WriteString(it.key(), out);
      out += pretty ? ": " : ":";
    }
    Write(it.value(), indent, level + 1, out);
  }
  if (pretty) {
    out += '\n';
    out.append(static_cast<size_t>(indent) * level, ' ');
  }
  out += object ? '}' : ']';
}

}  // namespace

std::string DumpJson(const nlohmann::json& value, int indent) {
  std::string out;
  Write(value, indent, 0, out);
  return out;
}

std::string XmlText(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    size_t n = Utf8Length(text, i);
    // U+FFFE and U+FFFF are no XML characters either: their bytes as \xNN.
    if (n == 3 && text.substr(i, 2) == "\xEF\xBF" &&
        static_cast<unsigned char>(text[i + 2]) >= 0xBE)
      n = 0;
    if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    ++i;
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '\'':
        out += "&apos;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        if (n == 0 || c < 0x20 || c == 0x7F) {
          out += "\\x";
          out += kHex[c >> 4];
          out += kHex[c & 0xF];
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

}  // namespace stoker
