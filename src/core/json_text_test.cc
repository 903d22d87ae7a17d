#include "stoker/json_text.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

namespace stoker {
namespace {

using nlohmann::json;

json Example() {
  return {{"samples", 12},
          {"rate", 0.1 + 0.2},
          {"big", UINT64_MAX},
          {"negative", -3},
          {"none", nullptr},
          {"yes", true},
          {"empty_list", json::array()},
          {"empty_object", json::object()},
          {"text", "quote \" backslash \\ controls \b\f\n\r\t\x01\x1f del \x7f"},
          {"utf8", "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80 \xf4\x8f\xbf\xbf"},
          {"nested", {{"list", {1, "two", {{"three", 3}}, json::array({json::object()})}}}},
          {"\xc3\xa9t\xc3\xa9 key", "x"}};
}

TEST(DumpJsonTest, ValidTextIsWhatDumpWrites) {
  for (int indent : {-1, 0, 1, 2, 4}) {
    EXPECT_EQ(DumpJson(Example(), indent), Example().dump(indent)) << indent;
  }
  for (const json& scalar : {json(1.5), json("a"), json(nullptr), json::array(), json::object()}) {
    EXPECT_EQ(DumpJson(scalar, 2), scalar.dump(2));
  }
}

TEST(DumpJsonTest, InvalidBytesBecomeSurrogateEscapesInValuesAndKeys) {
  json j = {{"key", "a\xff\xfe.jpg"}};
  j["\xff"] = "x";
  EXPECT_THROW(j.dump(), json::type_error);  // what the CLI hit before
  EXPECT_EQ(DumpJson(j), R"({"key":"a\udcff\udcfe.jpg","\udcff":"x"})");
}

TEST(DumpJsonTest, EachByteOfAMalformedSequenceIsEscaped) {
  struct Case {
    std::string in, out;
  } cases[] = {
      {"\x80", "\\udc80"},                                   // a lone continuation byte
      {"\xc3", "\\udcc3"},                                   // truncated at the end
      {"\xe2\x82z", "\\udce2\\udc82z"},                      // truncated before ASCII
      {"\xc0\xaf", "\\udcc0\\udcaf"},                        // overlong '/'
      {"\xe0\x80\xaf", "\\udce0\\udc80\\udcaf"},             // overlong, 3 bytes
      {"\xed\xa0\x80", "\\udced\\udca0\\udc80"},             // an encoded surrogate
      {"\xf4\x90\x80\x80", "\\udcf4\\udc90\\udc80\\udc80"},  // above U+10FFFF
      {"\xf5\xff", "\\udcf5\\udcff"},
      {"\xe2\x82\xac\xff\xc3\xa9", "\xe2\x82\xac\\udcff\xc3\xa9"},  // valid around invalid
  };
  for (const Case& c : cases) {
    EXPECT_EQ(DumpJson(json(c.in)), "\"" + c.out + "\"") << json(c.out).dump();
  }
}

TEST(DumpJsonTest, OutputIsAlwaysValidUtf8) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  const std::string text = DumpJson(json{{all, all}}, 2);
  // dump() of a string holding the text checks its UTF-8 strictly.
  EXPECT_NO_THROW(json(text).dump());
}

TEST(XmlTextTest, MarkupIsEscapedAndBytesXmlCannotHoldAreShown) {
  EXPECT_EQ(XmlText("R&D <a> 'b' \"c\""), "R&amp;D &lt;a&gt; &apos;b&apos; &quot;c&quot;");
  EXPECT_EQ(XmlText("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac");  // UTF-8 as it is
  EXPECT_EQ(XmlText("a\x01\x1b[0m\x7f"), "a\\x01\\x1b[0m\\x7f");
  EXPECT_EQ(XmlText("\xff\xc3"), "\\xff\\xc3");           // not UTF-8
  EXPECT_EQ(XmlText("\xef\xbf\xbe"), "\\xef\\xbf\\xbe");  // U+FFFE: no XML character
  EXPECT_EQ(XmlText("tab\tand\nline"), "tab\\x09and\\x0aline");
}

}  // namespace
}  // namespace stoker
