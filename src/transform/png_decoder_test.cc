#include "transform/png_decoder.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <string>
#include <tuple>

#include "testing/test_images.h"

namespace stoker {
namespace {

using testing::AsBytes;
using testing::MakePicture;
using testing::Png;

const uint8_t* Pixel(const DecodedRegion& r, int x, int y) {
  return r.pixels + static_cast<size_t>(y - r.y0) * r.stride + static_cast<size_t>(x - r.x0) * 3;
}

// A chunk: length, type, data, and the CRC of type and data.
std::vector<uint8_t> Chunk(const char* type, const std::vector<uint8_t>& data) {
  const auto n = static_cast<uint32_t>(data.size());
  std::vector<uint8_t> chunk(12 + data.size());
  const auto put32 = [&](size_t at, uLong v) {
    for (size_t i = 0; i < 4; ++i) chunk[at + i] = static_cast<uint8_t>(v >> (24 - 8 * i));
  };
  put32(0, n);
  std::memcpy(&chunk[4], type, 4);
  std::copy(data.begin(), data.end(), chunk.begin() + 8);
  put32(8 + n, crc32(0, &chunk[4], n + 4));
  return chunk;
}

// The data length of the chunk at `at` (its length field) in `file`.
size_t ChunkLength(const std::vector<uint8_t>& file, size_t at) {
  return size_t{file[at]} << 24 | size_t{file[at + 1]} << 16 | size_t{file[at + 2]} << 8 |
         file[at + 3];
}

// Where each chunk of `type` starts in `file`.
std::vector<size_t> FindChunks(const std::vector<uint8_t>& file, const char* type) {
  std::vector<size_t> found;
  for (size_t i = 8; i + 12 <= file.size(); i += 12 + ChunkLength(file, i)) {
    if (std::memcmp(&file[i + 4], type, 4) == 0) found.push_back(i);
  }
  return found;
}

// `samples` written as gray of `bit_depth` bits, then made a palette image
// of `palette` (RGB triples): a writer that does not check its indices.
std::vector<uint8_t> PaletteWithoutChecks(const std::vector<uint8_t>& samples, int width,
                                          int height, int bit_depth,
                                          const std::vector<uint8_t>& palette) {
  auto file = Png(samples, width, height, PNG_COLOR_TYPE_GRAY, bit_depth);
  std::vector<uint8_t> ihdr(file.begin() + 16, file.begin() + 29);
  ihdr[9] = PNG_COLOR_TYPE_PALETTE;
  auto head = Chunk("IHDR", ihdr);
  auto plte = Chunk("PLTE", palette);
  head.insert(head.end(), plte.begin(), plte.end());
  file.erase(file.begin() + 8, file.begin() + 33);
  file.insert(file.begin() + 8, head.begin(), head.end());
  return file;
}

TEST(PngDecoderTest, RgbFullAndRegion) {
  auto pic = MakePicture(71, 53);
  for (bool interlaced : {false, true}) {
    auto file = Png(pic, 71, 53, PNG_COLOR_TYPE_RGB, 8, interlaced);
    PngDecoder dec;
    std::vector<uint8_t> buf;
    DecodedRegion r;
    ASSERT_TRUE(dec.DecodeFull(AsBytes(file), &buf, &r).ok());
    ASSERT_EQ(r.width, 71);
    ASSERT_EQ(r.height, 53);
    EXPECT_EQ(0, std::memcmp(r.pixels, pic.data(), pic.size()));
    ASSERT_TRUE(dec.ReadHeader(AsBytes(file)).ok());
    EXPECT_EQ(dec.width(), 71);
    ASSERT_TRUE(dec.DecodeRegion(10, 20, 30, 41, &buf, &r).ok());
    EXPECT_EQ(r.x0, 10);
    EXPECT_EQ(r.y0, 20);
    for (int y = 20; y < 41; ++y) {
      for (int x = 10; x < 30; ++x) {
        ASSERT_EQ(0, std::memcmp(Pixel(r, x, y), &pic[(y * 71 + x) * 3], 3)) << interlaced;
      }
    }
  }
}

TEST(PngDecoderTest, GrayPaletteAlphaAnd16BitBecomeRgb) {
  const int w = 9, h = 5;
  PngDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  // 8-bit gray.
  std::vector<uint8_t> gray(w * h);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 5);
  ASSERT_TRUE(dec.DecodeFull(AsBytes(Png(gray, w, h, PNG_COLOR_TYPE_GRAY, 8)), &buf, &r).ok());
  EXPECT_EQ(Pixel(r, 3, 2)[0], gray[2 * w + 3]);
  EXPECT_EQ(Pixel(r, 3, 2)[2], gray[2 * w + 3]);
  // 1-bit gray: rows are packed, ceil(9 / 8) = 2 bytes; 0b1010... pattern.
  std::vector<uint8_t> bits(2 * h, 0xAA);
  ASSERT_TRUE(dec.DecodeFull(AsBytes(Png(bits, w, h, PNG_COLOR_TYPE_GRAY, 1)), &buf, &r).ok());
  EXPECT_EQ(Pixel(r, 0, 0)[1], 255);
  EXPECT_EQ(Pixel(r, 1, 0)[1], 0);
  // Palette.
  std::vector<png_color> palette = {{255, 0, 0}, {0, 0, 255}};
  std::vector<uint8_t> indices(w * h, 1);
  ASSERT_TRUE(dec.DecodeFull(AsBytes(Png(indices, w, h, PNG_COLOR_TYPE_PALETTE, 8, false, palette)),
                             &buf, &r)
                  .ok());
  EXPECT_EQ(Pixel(r, 4, 4)[0], 0);
  EXPECT_EQ(Pixel(r, 4, 4)[2], 255);
  // Palette with transparency (tRNS), 8- and 2-bit: its colours, alpha dropped
  // as PIL's convert("RGB") drops it.
  const std::vector<png_byte> alpha = {0, 128};
  ASSERT_TRUE(
      dec.DecodeFull(AsBytes(Png(indices, w, h, PNG_COLOR_TYPE_PALETTE, 8, false, palette, alpha)),
                     &buf, &r)
          .ok());
  EXPECT_EQ(Pixel(r, 4, 4)[0], 0);
  EXPECT_EQ(Pixel(r, 4, 4)[2], 255);
  std::vector<uint8_t> packed(3 * h, 0x44);  // 2-bit indices 1, 0, 1, 0...: ceil(9 / 4) bytes a row
  ASSERT_TRUE(
      dec.DecodeFull(AsBytes(Png(packed, w, h, PNG_COLOR_TYPE_PALETTE, 2, false, palette, alpha)),
                     &buf, &r)
          .ok());
  EXPECT_EQ(Pixel(r, 0, 0)[2], 255);  // index 1: blue
  EXPECT_EQ(Pixel(r, 1, 0)[0], 255);  // index 0: red
  // RGBA: alpha dropped.
  std::vector<uint8_t> rgba(w * h * 4);
  for (size_t i = 0; i < rgba.size(); ++i) rgba[i] = static_cast<uint8_t>(i % 4 == 3 ? 0 : 77);
  ASSERT_TRUE(dec.DecodeFull(AsBytes(Png(rgba, w, h, PNG_COLOR_TYPE_RGB_ALPHA, 8)), &buf, &r).ok());
  EXPECT_EQ(Pixel(r, 8, 4)[1], 77);
  // 16-bit RGB: the high byte.
  std::vector<uint8_t> deep(w * h * 6);
  for (size_t i = 0; i < deep.size(); i += 2) {
    deep[i] = 0x12;
    deep[i + 1] = 0xFF;
  }
  ASSERT_TRUE(dec.DecodeFull(AsBytes(Png(deep, w, h, PNG_COLOR_TYPE_RGB, 16)), &buf, &r).ok());
  EXPECT_EQ(Pixel(r, 5, 1)[0], 0x12);
}

// PIL opens 16-bit gray as mode "I", whose RGB clamps each value to 255
// (torchvision's ImageFolder sees that); 16-bit gray with alpha keeps the
// high byte, as 16-bit RGB does.
TEST(PngDecoderTest, SixteenBitGrayClampsAsPilDoes) {
  const int w = 6, h = 3;
  const uint16_t values[w] = {0, 7, 255, 256, 0x1234, 0xFFFF};
  std::vector<uint8_t> gray(w * h * 2), gray_alpha(w * h * 4);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const size_t i = static_cast<size_t>(y * w + x);
      gray[2 * i] = gray_alpha[4 * i] = static_cast<uint8_t>(values[x] >> 8);
      gray[2 * i + 1] = gray_alpha[4 * i + 1] = static_cast<uint8_t>(values[x] & 0xFF);
      gray_alpha[4 * i + 2] = gray_alpha[4 * i + 3] = 0x80;
    }
  }
  for (bool interlaced : {false, true}) {
    PngDecoder dec;
    std::vector<uint8_t> buf;
    DecodedRegion r;
    const auto file = Png(gray, w, h, PNG_COLOR_TYPE_GRAY, 16, interlaced);
    ASSERT_TRUE(dec.DecodeFull(AsBytes(file), &buf, &r).ok());
    const uint8_t want[w] = {0, 7, 255, 255, 255, 255};
    for (int x = 0; x < w; ++x) {
      for (int c = 0; c < 3; ++c) EXPECT_EQ(Pixel(r, x, 2)[c], want[x]) << x << interlaced;
    }
    ASSERT_TRUE(dec.ReadHeader(AsBytes(file)).ok());
    ASSERT_TRUE(dec.DecodeRegion(1, 1, 3, 2, &buf, &r).ok());
    EXPECT_EQ(Pixel(r, 1, 1)[0], 7);
    EXPECT_EQ(Pixel(r, 2, 1)[2], 255);
    ASSERT_TRUE(
        dec.DecodeFull(AsBytes(Png(gray_alpha, w, h, PNG_COLOR_TYPE_GRAY_ALPHA, 16, interlaced)),
                       &buf, &r)
            .ok());
    EXPECT_EQ(Pixel(r, 1, 0)[0], 0);
    EXPECT_EQ(Pixel(r, 4, 0)[1], 0x12);
    EXPECT_EQ(Pixel(r, 5, 0)[2], 0xFF);
  }
}

// As for JPEG: a file cut short fails whatever rows the region needs, not
// only when the decoder reads as far as the damage.
// Pillow's verdict on a file cut short (checked with Pillow 9.4): every row's
// image data must be there (IEND, the last IDAT's CRC and even its zlib
// checksum may be gone), and a chunk after the image data whose header is
// there must be whole. The same whatever the region decoded.
TEST(PngDecoderTest, AFileCutShortGetsPillowsVerdictWhateverTheRegion) {
  const auto pic = MakePicture(64, 64);
  const std::vector<std::tuple<int, int, int, int>> regions = {{0, 0, 64, 4}, {10, 20, 30, 30}};
  auto verdicts = [&](const std::vector<uint8_t>& file, bool whole, const std::string& what) {
    for (auto [x0, y0, x1, y1] : regions) {
      PngDecoder dec;
      std::vector<uint8_t> buf;
      DecodedRegion r;
      Status s = dec.ReadHeader(AsBytes(file));
      if (s.ok()) s = dec.DecodeRegion(x0, y0, x1, y1, &buf, &r);
      if (whole) {
        EXPECT_TRUE(s.ok()) << what << ", rows [" << y0 << ", " << y1 << "): " << s.ToString();
      } else {
        EXPECT_EQ(s.code(), StatusCode::kDataError)
            << what << ", rows [" << y0 << ", " << y1 << "): " << s.ToString();
        EXPECT_NE(s.message().find("premature end"), std::string::npos) << s.message();
      }
    }
    if (!whole) return;
    PngDecoder dec;
    std::vector<uint8_t> buf;
    DecodedRegion r;
    ASSERT_TRUE(dec.DecodeFull(AsBytes(file), &buf, &r).ok()) << what;
    EXPECT_EQ(0, std::memcmp(r.pixels, pic.data(), pic.size())) << what;  // as Pillow's
  };
  for (bool interlaced : {false, true}) {
    const auto file = Png(pic, 64, 64, PNG_COLOR_TYPE_RGB, 8, interlaced);
    // IEND (12 bytes), part of it, the last IDAT's CRC, its zlib checksum: read
    // as Pillow reads them. 100 bytes: rows are gone.
    for (size_t lost : {4, 8, 12, 13, 16, 20, 100}) {
      std::vector<uint8_t> cut(file.begin(), file.end() - static_cast<ptrdiff_t>(lost));
      verdicts(cut, lost != 100,
               std::to_string(lost) + " bytes lost, interlaced " + std::to_string(interlaced));
    }
    // A tEXt chunk after the image data: cut in its header, fine; in its data, not.
    std::vector<uint8_t> text = {0, 0, 0, 40, 't', 'E', 'X', 't', 'a', 0};
    text.resize(8 + 40 + 4, 'x');
    std::vector<uint8_t> with(file.begin(), file.end() - 12);
    with.insert(with.end(), text.begin(), text.end());
    with.insert(with.end(), file.end() - 12, file.end());
    for (size_t lost : {12, 16, 12 + 52 - 6, 20, 12 + 52 - 8}) {
      std::vector<uint8_t> cut(with.begin(), with.end() - static_cast<ptrdiff_t>(lost));
      verdicts(cut, lost == 12 || lost == 16 || lost == 12 + 52 - 6,
               "tEXt after the data, " + std::to_string(lost) + " bytes lost");
    }
  }
  // Bytes after IEND are not part of the image.
  std::vector<uint8_t> trailing = Png(pic, 64, 64, PNG_COLOR_TYPE_RGB, 8);
  trailing.insert(trailing.end(), 40, 0x55);
  PngDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  EXPECT_TRUE(dec.DecodeFull(AsBytes(trailing), &buf, &r).ok());
}

// Pillow never checks the image data's CRCs (libpng would refuse the file):
// the pixels are returned, whatever the region.
TEST(PngDecoderTest, ABadImageDataCrcIsIgnoredAsPillowIgnoresIt) {
  const auto pic = MakePicture(64, 64);
  for (bool interlaced : {false, true}) {
    auto file = Png(pic, 64, 64, PNG_COLOR_TYPE_RGB, 8, interlaced);
    const auto idats = FindChunks(file, "IDAT");
    ASSERT_FALSE(idats.empty());
    for (size_t at : idats) file[at + 8 + ChunkLength(file, at) + 3] ^= 0xFF;  // its CRC
    PngDecoder dec;
    std::vector<uint8_t> buf;
    DecodedRegion r;
    Status s = dec.DecodeFull(AsBytes(file), &buf, &r);
    ASSERT_TRUE(s.ok()) << interlaced << ": " << s.ToString();
    EXPECT_EQ(0, std::memcmp(r.pixels, pic.data(), pic.size())) << interlaced;
  }
}

// Pillow refuses a bad CRC in any chunk before the image data, an ancillary
// one too (libpng alone would drop that chunk and go on).
TEST(PngDecoderTest, ABadCrcBeforeTheImageDataIsAnErrorAsInPillow) {
  const auto file = Png(MakePicture(16, 16), 16, 16, PNG_COLOR_TYPE_RGB, 8);
  for (const char* type : {"gAMA", "tEXt"}) {
    auto chunk = Chunk(type, {0x00, 0x00, 0xB1, 0x8F});
    chunk.back() ^= 0xFF;
    std::vector<uint8_t> bad = file;
    bad.insert(bad.begin() + 33, chunk.begin(), chunk.end());  // after IHDR
    PngDecoder dec;
    Status s = dec.ReadHeader(AsBytes(bad));
    EXPECT_EQ(s.code(), StatusCode::kDataError) << type << ": " << s.ToString();
    EXPECT_NE(s.message().find("CRC error"), std::string::npos) << s.message();
  }
}

// An index past the PLTE's entries (invalid; some tools write it) is the grey
// of its value in Pillow (its palette padded with a grey ramp); libpng alone
// gives black.
TEST(PngDecoderTest, IndicesPastThePaletteAreTheGreyPillowGives) {
  PngDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  std::vector<uint8_t> indices(16 * 16);
  for (size_t i = 0; i < indices.size(); ++i) indices[i] = static_cast<uint8_t>(i);
  auto file = PaletteWithoutChecks(indices, 16, 16, 8, {255, 0, 0, 0, 255, 0});
  ASSERT_TRUE(dec.DecodeFull(AsBytes(file), &buf, &r).ok());
  EXPECT_EQ(std::vector<uint8_t>(Pixel(r, 0, 0), Pixel(r, 0, 0) + 6),
            (std::vector<uint8_t>{255, 0, 0, 0, 255, 0}));
  for (int i = 2; i < 256; ++i) {
    const uint8_t* p = Pixel(r, i % 16, i / 16);
    ASSERT_TRUE(p[0] == i && p[1] == i && p[2] == i) << "index " << i << ": " << int{p[0]};
  }
  // 2-bit indices 3, 2, 1, 0 over a one-entry palette.
  file = PaletteWithoutChecks(std::vector<uint8_t>(2 * 2, 0xE4), 8, 2, 2, {255, 0, 0});
  ASSERT_TRUE(dec.DecodeFull(AsBytes(file), &buf, &r).ok());
  for (int x = 0; x < 4; ++x) {
    const uint8_t* p = Pixel(r, x, 1);
    const int want = 3 - x;
    EXPECT_TRUE(want == 0 ? p[0] == 255 && p[1] == 0 : p[0] == want && p[1] == want && p[2] == want)
        << "index " << want << ": " << int{p[0]} << " " << int{p[1]} << " " << int{p[2]};
  }
}

TEST(PngDecoderTest, BadDataIsAnError) {
  auto file = Png(MakePicture(64, 64), 64, 64, PNG_COLOR_TYPE_RGB, 8);
  PngDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  Status s = dec.ReadHeader({});
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  // Truncated in the image data.
  std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<ptrdiff_t>(file.size() / 2));
  s = dec.DecodeFull(AsBytes(cut), &buf, &r);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  EXPECT_NE(s.message().find("premature end"), std::string::npos) << s.message();
  // Truncated in the header.
  std::vector<uint8_t> header(file.begin(), file.begin() + 20);
  EXPECT_EQ(dec.ReadHeader(AsBytes(header)).code(), StatusCode::kDataError);
  // A flipped bit in the header chunk breaks its CRC.
  std::vector<uint8_t> bad = file;
  bad[20] ^= 0x40;
  s = dec.DecodeFull(AsBytes(bad), &buf, &r);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  // Corrupt compressed data.
  bad = file;
  for (size_t i = 60; i < 120; ++i) bad[i] = static_cast<uint8_t>(i * 37);
  s = dec.DecodeFull(AsBytes(bad), &buf, &r);
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  // Still usable.
  EXPECT_TRUE(dec.DecodeFull(AsBytes(file), &buf, &r).ok());
}

}  // namespace
}  // namespace stoker
