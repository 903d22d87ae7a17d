#include "transform/image_format.h"

#include <cstdio>

namespace stoker {
namespace {

bool StartsWith(std::span<const std::byte> data, size_t at, std::string_view sig) {
  if (data.size() < at + sig.size()) return false;
  for (size_t i = 0; i < sig.size(); ++i) {
    if (data[at + i] != static_cast<std::byte>(sig[i])) return false;
  }
  return true;
}

std::string FirstBytes(std::span<const std::byte> data) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < data.size() && i < 8; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(data[i]));
    if (!s.empty()) s += ' ';
    s += buf;
  }
  return s;
}

}  // namespace

std::string_view OtherImageFormat(std::span<const std::byte> data) {
  using namespace std::string_view_literals;
  if (StartsWith(data, 0, "BM")) return "BMP";
  if (StartsWith(data, 0, "GIF87a") || StartsWith(data, 0, "GIF89a")) return "GIF";
  if (StartsWith(data, 0, "II*\0"sv) || StartsWith(data, 0, "MM\0*"sv)) return "TIFF";
  if (StartsWith(data, 0, "RIFF") && StartsWith(data, 8, "WEBP")) return "WebP";
  if (StartsWith(data, 4, "ftypavif") || StartsWith(data, 4, "ftypavis")) return "AVIF";
  for (std::string_view brand : {"heic"sv, "heix"sv, "mif1"sv, "msf1"sv}) {
    if (StartsWith(data, 4, "ftyp") && StartsWith(data, 8, brand)) return "HEIF";
  }
  if (StartsWith(data, 0, "\0\0\0\x0cjP  "sv) || StartsWith(data, 0, "\xff\x4f\xff\x51"sv)) {
    return "JPEG 2000";
  }
  if (StartsWith(data, 0, "\xff\x0a"sv) || StartsWith(data, 0, "\0\0\0\x0cJXL "sv)) {
    return "JPEG XL";
  }
  if (data.size() >= 3 && data[0] == std::byte{'P'} && data[1] >= std::byte{'1'} &&
      data[1] <= std::byte{'7'} &&
      (data[2] == std::byte{'\n'} || data[2] == std::byte{' '} || data[2] == std::byte{'\r'} ||
       data[2] == std::byte{'\t'})) {
    return "PNM";
  }
  return "";
}

std::string NotJpegOrPng(std::span<const std::byte> data) {
  if (const std::string_view format = OtherImageFormat(data); !format.empty()) {
    const bool vowel = std::string_view("AEIOU").find(format[0]) != std::string_view::npos;
    return (vowel ? "an " : "a ") + std::string(format) + " image (stoker decodes JPEG and PNG)";
  }
  return "not a JPEG or PNG image (first bytes: " + FirstBytes(data) + ")";
}

}  // namespace stoker
