#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

namespace stoker {

/// The image format other than JPEG and PNG that `data` starts like ("BMP",
/// "TIFF", "WebP", ...), by its signature; "" where none is known.
std::string_view OtherImageFormat(std::span<const std::byte> data);

/// Why `data` is not read by stoker's own decoders, for an error: "a BMP
/// image (stoker decodes JPEG and PNG)" where the format is known, else "not
/// a JPEG or PNG image (first bytes: 3c 68 74 6d ...)".
std::string NotJpegOrPng(std::span<const std::byte> data);

}  // namespace stoker
