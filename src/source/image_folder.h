#pragma once

#include <string_view>

#include "stoker/image_sources.h"

namespace stoker {

// OpenImageFolder (declared in stoker/image_sources.h) lives in
// image_folder.cc; these are the two rules it shares with torchvision,
// exposed for tests.

/// True if `a` sorts before `b` the way Python sorts the names os.fsdecode
/// makes of them on Linux (UTF-8 with surrogate escapes): by code point, where
/// a byte that is not part of valid UTF-8 counts as U+DC00 + byte. Equals
/// byte order whenever both are valid UTF-8.
bool PythonNameLess(std::string_view a, std::string_view b);

/// True if the lower-cased `name` ends with one of torchvision's
/// IMG_EXTENSIONS: .jpg .jpeg .png .ppm .bmp .pgm .tif .tiff .webp.
bool HasImageExtension(std::string_view name);

}  // namespace stoker
