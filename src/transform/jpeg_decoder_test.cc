#include "transform/jpeg_decoder.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <tuple>

#include "testing/test_images.h"

namespace stoker {
namespace {

using testing::AsBytes;
using testing::Image;
using testing::Jpeg;
using testing::MakePicture;
using testing::ReferenceDecodeJpeg;

// Position of the first marker `code` (the byte after 0xFF) in `file`.
size_t FindMarker(const std::vector<uint8_t>& file, uint8_t code) {
  for (size_t i = 2; i + 1 < file.size(); ++i) {
    if (file[i] == 0xFF && file[i + 1] == code) return i;
  }
  ADD_FAILURE() << "marker not found";
  return 0;
}

int MaxDifference(const DecodedRegion& r, const Image& ref, int x0, int y0, int x1, int y1) {
  int worst = 0;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      const uint8_t* p = r.pixels + static_cast<size_t>(y - r.y0) * r.stride + (x - r.x0) * 3;
      const uint8_t* q = ref.at(x, y);
      for (int c = 0; c < 3; ++c) worst = std::max(worst, std::abs(p[c] - q[c]));
    }
  }
  return worst;
}

TEST(JpegDecoderTest, FullDecodeMatchesLibjpeg) {
  auto file = Jpeg(MakePicture(203, 151), 203, 151);
  JpegDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  for (int denom : {1, 2, 4, 8}) {
    ASSERT_TRUE(dec.DecodeFull(AsBytes(file), denom, &buf, &r).ok());
    Image ref = ReferenceDecodeJpeg(file, denom);
    ASSERT_EQ(r.width, ref.width);
    ASSERT_EQ(r.height, ref.height);
    EXPECT_EQ(r.width, JpegDecoder::ScaledSize(203, denom));
    EXPECT_EQ(MaxDifference(r, ref, 0, 0, ref.width, ref.height), 0) << "denom " << denom;
  }
}

TEST(JpegDecoderTest, RegionMatchesFullDecode) {
  for (bool progressive : {false, true}) {
    JpegEncodeOptions eo;
    eo.progressive = progressive;
    auto file = Jpeg(MakePicture(320, 240), 320, 240, 3, eo);
    JpegDecoder dec;
    std::vector<uint8_t> buf;
    // Edges inside iMCUs and on their boundaries (multiples of 16 / denom).
    for (auto [denom, x0, y0, x1, y1] :
         {std::tuple{1, 37, 45, 250, 201}, std::tuple{2, 18, 22, 125, 100},
          std::tuple{4, 9, 11, 62, 50}, std::tuple{1, 32, 48, 256, 224},
          std::tuple{2, 16, 24, 128, 112}, std::tuple{8, 4, 6, 40, 30}}) {
      Image ref = ReferenceDecodeJpeg(file, denom);
      ASSERT_TRUE(dec.ReadHeader(AsBytes(file)).ok());
      EXPECT_EQ(dec.width(), 320);
      EXPECT_EQ(dec.height(), 240);
      DecodedRegion r;
      ASSERT_TRUE(dec.DecodeRegion(denom, x0, y0, x1, y1, &buf, &r).ok());
      EXPECT_LE(r.x0, x0);
      EXPECT_GE(r.x0 + r.width, x1);
      EXPECT_EQ(r.y0, y0);
      EXPECT_EQ(r.height, y1 - y0);
      // Cropping and skipping keep the chroma upsampler's context: the
      // pixels equal the full decode's.
      EXPECT_EQ(MaxDifference(r, ref, x0, y0, x1, y1), 0)
          << "denom " << denom << " progressive " << progressive;
    }
  }
}

TEST(JpegDecoderTest, GrayscaleBecomesRgb) {
  std::vector<uint8_t> gray(64 * 48);
  for (size_t i = 0; i < gray.size(); ++i) gray[i] = static_cast<uint8_t>(i * 7);
  auto file = Jpeg(gray, 64, 48, 1);
  JpegDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  ASSERT_TRUE(dec.DecodeFull(AsBytes(file), 1, &buf, &r).ok());
  ASSERT_EQ(r.width, 64);
  for (int i = 0; i < 64 * 48; ++i) {
    ASSERT_EQ(r.pixels[i * 3], r.pixels[i * 3 + 1]);
    ASSERT_EQ(r.pixels[i * 3], r.pixels[i * 3 + 2]);
  }
}

TEST(JpegDecoderTest, AdobeCmykAndYcckBecomeRgb) {
  // Four flat quadrants, stored inverted as Adobe applications write CMYK.
  struct Ink {
    int c, m, y, k;
    int r, g, b;
  };
  const Ink inks[4] = {{0, 0, 0, 0, 255, 255, 255},
                       {255, 0, 0, 0, 0, 255, 255},
                       {0, 255, 255, 0, 255, 0, 0},
                       {0, 0, 0, 128, 127, 127, 127}};
  const int w = 64, h = 64;
  std::vector<uint8_t> cmyk(w * h * 4);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const Ink& ink = inks[(y / 32) * 2 + x / 32];
      uint8_t* p = &cmyk[(y * w + x) * 4];
      p[0] = static_cast<uint8_t>(255 - ink.c);
      p[1] = static_cast<uint8_t>(255 - ink.m);
      p[2] = static_cast<uint8_t>(255 - ink.y);
      p[3] = static_cast<uint8_t>(255 - ink.k);
    }
  }
  JpegEncodeOptions eo;
  eo.quality = 98;
  JpegDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  for (bool ycck : {false, true}) {
    eo.ycck = ycck;
    auto stored = Jpeg(cmyk, w, h, 4, eo);
    ASSERT_TRUE(dec.DecodeFull(AsBytes(stored), 1, &buf, &r).ok());
    for (int q = 0; q < 4; ++q) {
      const int x = (q % 2) * 32 + 16, y = (q / 2) * 32 + 16;
      const uint8_t* p = r.pixels + y * r.stride + x * 3;
      EXPECT_NEAR(p[0], inks[q].r, 3) << "quadrant " << q << " ycck " << ycck;
      EXPECT_NEAR(p[1], inks[q].g, 3) << "quadrant " << q << " ycck " << ycck;
      EXPECT_NEAR(p[2], inks[q].b, 3) << "quadrant " << q << " ycck " << ycck;
    }
  }
  eo.ycck = false;
  auto file = Jpeg(cmyk, w, h, 4, eo);
  // A region of a CMYK image goes through the same conversion.
  ASSERT_TRUE(dec.ReadHeader(AsBytes(file)).ok());
  ASSERT_TRUE(dec.DecodeRegion(2, 16, 16, 32, 32, &buf, &r).ok());
  const uint8_t* p = r.pixels + (24 - r.y0) * r.stride + (24 - r.x0) * 3;
  EXPECT_NEAR(p[0], 127, 3);
}

// Pillow reads every CMYK JPEG as Adobe applications store it, inverted,
// whether or not the file has Adobe's APP14 marker; so does stoker (before,
// a file without the marker came back with every pixel inverted).
TEST(JpegDecoderTest, ACmykJpegWithoutAnAdobeMarkerIsReadAsPillowReadsIt) {
  const int w = 32, h = 32;
  // Stored inverted: 255 - ink; cyan ink alone, so red is 0 and green, blue 255.
  std::vector<uint8_t> cmyk(w * h * 4, 255);
  for (int i = 0; i < w * h; ++i) cmyk[i * 4] = 0;
  JpegEncodeOptions eo;
  eo.quality = 98;
  std::vector<uint8_t> file = Jpeg(cmyk, w, h, 4, eo);
  // Cut the APP14 segment (FF EE, its length) out.
  size_t at = 2;
  while (at + 4 <= file.size() && !(file[at] == 0xFF && file[at + 1] == 0xEE)) {
    at += 2 + (static_cast<size_t>(file[at + 2]) << 8 | file[at + 3]);
  }
  ASSERT_LT(at + 4, file.size()) << "the encoder wrote no Adobe marker";
  const size_t length = static_cast<size_t>(file[at + 2]) << 8 | file[at + 3];
  file.erase(file.begin() + static_cast<std::ptrdiff_t>(at),
             file.begin() + static_cast<std::ptrdiff_t>(at + 2 + length));
  JpegDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  ASSERT_TRUE(dec.DecodeFull(AsBytes(file), 1, &buf, &r).ok());
  const uint8_t* p = r.pixels + 16 * r.stride + 16 * 3;
  EXPECT_NEAR(p[0], 0, 3);
  EXPECT_NEAR(p[1], 255, 3);
  EXPECT_NEAR(p[2], 255, 3);
}

TEST(JpegDecoderTest, ArithmeticCodingDecodesLikeHuffman) {
  auto pic = MakePicture(96, 80);
  JpegEncodeOptions arith;
  arith.arithmetic = true;
  std::vector<uint8_t> arith_file;
  Status encoded = EncodeJpeg(pic.data(), 96, 80, 3, arith, &arith_file);
  if (!encoded.ok()) GTEST_SKIP() << "this libjpeg cannot write arithmetic coding";
  auto huff_file = Jpeg(pic, 96, 80);
  JpegDecoder dec;
  std::vector<uint8_t> a, b;
  DecodedRegion ra, rb;
  Status s = dec.DecodeFull(AsBytes(arith_file), 1, &a, &ra);
  if (!s.ok()) {
    // A build without arithmetic decoding must say so, not crash.
    EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
    return;
  }
  ASSERT_TRUE(dec.DecodeFull(AsBytes(huff_file), 1, &b, &rb).ok());
  // Entropy coding is lossless: the same coefficients, the same pixels.
  EXPECT_EQ(0, std::memcmp(ra.pixels, rb.pixels, 96 * 80 * 3));
}

TEST(JpegDecoderTest, EmptyIsAnError) {
  JpegDecoder dec;
  Status s = dec.ReadHeader({});
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_NE(s.message().find("empty"), std::string::npos) << s.message();
}

TEST(JpegDecoderTest, TruncatedFileIsAnErrorNotGreyPixels) {
  auto file = Jpeg(MakePicture(200, 160), 200, 160);
  JpegDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  for (size_t keep : {file.size() / 2, file.size() - 40, size_t{300}}) {
    std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<ptrdiff_t>(keep));
    Status s = dec.DecodeFull(AsBytes(cut), 1, &buf, &r);
    EXPECT_EQ(s.code(), StatusCode::kDataError) << keep << ": " << s.ToString();
    EXPECT_NE(s.message().find("Premature end"), std::string::npos) << s.message();
  }
  // Header cut short.
  std::vector<uint8_t> header(file.begin(), file.begin() + 30);
  Status s = dec.ReadHeader(AsBytes(header));
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
  // The decoder is reusable after errors.
  EXPECT_TRUE(dec.DecodeFull(AsBytes(file), 1, &buf, &r).ok());
}

// The verdict on a file does not depend on the rows a region needs: a file
// cut short fails even where the region ends above the damage, which a
// decoder that stops after the region's last row never reaches.
TEST(JpegDecoderTest, TruncatedFileFailsWhateverTheRegion) {
  for (bool progressive : {false, true}) {
    JpegEncodeOptions eo;
    eo.progressive = progressive;
    auto file = Jpeg(MakePicture(320, 240), 320, 240, 3, eo);
    // The last 100 bytes gone; only the EOI marker gone.
    for (size_t lost : {size_t{100}, size_t{2}}) {
      std::vector<uint8_t> cut(file.begin(), file.end() - static_cast<ptrdiff_t>(lost));
      JpegDecoder dec;
      std::vector<uint8_t> buf;
      for (auto [denom, x0, y0, x1, y1] :
           {std::tuple{1, 0, 0, 320, 16}, std::tuple{1, 200, 8, 240, 40},
            std::tuple{2, 0, 0, 160, 120}, std::tuple{8, 0, 0, 40, 30}}) {
        Status s = dec.ReadHeader(AsBytes(cut));
        DecodedRegion r;
        if (s.ok()) s = dec.DecodeRegion(denom, x0, y0, x1, y1, &buf, &r);
        EXPECT_EQ(s.code(), StatusCode::kDataError)
            << "progressive " << progressive << ", " << lost << " bytes lost, rows [" << y0 << ", "
            << y1 << ") at 1/" << denom << ": " << s.ToString();
        EXPECT_NE(s.message().find("Premature end of JPEG file"), std::string::npos) << s.message();
      }
    }
  }
}

// The completeness check walks the file's markers: bytes after EOI (some
// cameras append data) are not part of the image, and an EOI inside a marker
// segment (an EXIF thumbnail) does not end it.
TEST(JpegDecoderTest, CompletenessLooksAtTheImageNotAtStrayEoiBytes) {
  auto file = Jpeg(MakePicture(96, 64), 96, 64);
  JpegDecoder dec;
  std::vector<uint8_t> buf;
  DecodedRegion r;
  std::vector<uint8_t> trailing = file;
  for (int i = 0; i < 300; ++i) trailing.push_back(static_cast<uint8_t>(i * 7));
  EXPECT_TRUE(dec.DecodeFull(AsBytes(trailing), 1, &buf, &r).ok());

  // An APP1 segment right after SOI that holds a whole tiny "JPEG".
  const std::vector<uint8_t> app1 = {0xFF, 0xE1, 0x00, 0x0A, 0xFF, 0xD8,
                                     0xFF, 0xD9, 0xFF, 0xD9, 0x00, 0x00};
  std::vector<uint8_t> thumb = file;
  thumb.insert(thumb.begin() + 2, app1.begin(), app1.end());
  EXPECT_TRUE(dec.DecodeFull(AsBytes(thumb), 1, &buf, &r).ok());
  thumb.resize(thumb.size() - 50);
  EXPECT_EQ(dec.ReadHeader(AsBytes(thumb)).code(), StatusCode::kDataError);

  // A segment length below 2, which libjpeg steps over, is no reason to
  // refuse the file (bytes after EOI make the check walk the markers).
  std::vector<uint8_t> zero_length = trailing;
  const std::vector<uint8_t> com = {0xFF, 0xFE, 0x00, 0x00};
  zero_length.insert(zero_length.begin() + 2, com.begin(), com.end());
  EXPECT_TRUE(dec.DecodeFull(AsBytes(zero_length), 1, &buf, &r).ok());
}

// Damaged entropy-coded data in a file that reaches its EOI only makes
// libjpeg warn and fill what it cannot read; Pillow ignores the warnings and
// returns those pixels (torchvision's sample), and so does the decoder, for
// any region and scale.
TEST(JpegDecoderTest, DamagedScanDataDecodesAsPillowReadsIt) {
  for (bool progressive : {false, true}) {
    JpegEncodeOptions eo;
    eo.progressive = progressive;
    const auto file = Jpeg(MakePicture(200, 160), 200, 160, 3, eo);
    // The scans cut in the middle and closed by EOI, as a tool closes a
    // partly downloaded file: "premature end of data segment" (a progressive
    // file loses its later scans: libjpeg smooths the blocks that lack them).
    const size_t first_sos = FindMarker(file, 0xDA);
    size_t scan_end = first_sos + 2;  // the first marker after its data
    while (!(file[scan_end] == 0xFF && file[scan_end + 1] != 0x00 &&
             (file[scan_end + 1] < 0xD0 || file[scan_end + 1] > 0xD7))) {
      ++scan_end;
    }
    const size_t half = first_sos + (scan_end - first_sos) / 2;
    std::vector<uint8_t> cut(file.begin(), file.begin() + static_cast<ptrdiff_t>(half));
    cut.insert(cut.end(), {0xFF, 0xD9});
    // After the last SOS only entropy-coded data comes (a progressive file
    // has tables between its scans). 0xFF 0x00 is a stuffed 0xFF byte: a
    // long run of 1 bits, which no Huffman code may be.
    size_t sos = file.size() - 2;
    while (!(file[sos] == 0xFF && file[sos + 1] == 0xDA)) --sos;
    const size_t mid = sos + (file.size() - sos) / 2;
    std::vector<uint8_t> garbled = file;
    for (size_t i = mid; i < mid + 40; i += 2) {
      garbled[i] = 0xFF;
      garbled[i + 1] = 0x00;
    }
    for (const auto& damaged : {cut, garbled}) {
      JpegDecoder dec;
      std::vector<uint8_t> buf;
      DecodedRegion r;
      for (int denom : {1, 2}) {
        const Image ref = ReferenceDecodeJpeg(damaged, denom);
        Status s = dec.DecodeFull(AsBytes(damaged), denom, &buf, &r);
        ASSERT_TRUE(s.ok()) << "progressive " << progressive << ": " << s.ToString();
        EXPECT_EQ(MaxDifference(r, ref, 0, 0, ref.width, ref.height), 0) << progressive;
        // A region below the damage, reached through skipped rows.
        const int x0 = ref.width / 4, y0 = ref.height / 2, x1 = ref.width / 2, y1 = ref.height;
        ASSERT_TRUE(dec.ReadHeader(AsBytes(damaged)).ok());
        ASSERT_TRUE(dec.DecodeRegion(denom, x0, y0, x1, y1, &buf, &r).ok());
        EXPECT_EQ(MaxDifference(r, ref, x0, y0, x1, y1), 0) << progressive << " 1/" << denom;
      }
    }
  }
}

TEST(JpegDecoderTest, GarbageAfterSoiIsAnError) {
  std::vector<uint8_t> file = {0xFF, 0xD8, 0xFF, 0x12, 0x34, 0x56, 0x78, 0x9A};
  JpegDecoder dec;
  Status s = dec.ReadHeader(AsBytes(file));
  EXPECT_EQ(s.code(), StatusCode::kDataError) << s.ToString();
}

TEST(JpegDecoderTest, TwelveBitIsUnsupported) {
  auto file = Jpeg(MakePicture(64, 64), 64, 64);
  size_t sof = FindMarker(file, 0xC0);
  ASSERT_EQ(file[sof + 4], 8);
  file[sof + 4] = 12;
  JpegDecoder dec;
  Status s = dec.ReadHeader(AsBytes(file));
  EXPECT_EQ(s.code(), StatusCode::kUnsupported) << s.ToString();
  EXPECT_NE(s.message().find("precision 12"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace stoker
