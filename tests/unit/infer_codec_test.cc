#include "frontends/http/infer_codec.h"

#include <cmath>
#include <cstring>
#include <random>

#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

#include "common/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::http {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::vector<T> As(std::string_view data) {
  std::vector<T> v(data.size() / sizeof(T));
  std::memcpy(v.data(), data.data(), data.size());
  return v;
}

TEST(InferCodecTest, NestedAndFlatJsonDataDecodeTheSame) {
  auto nested = ParseInferRequest(
      R"({"id":"r1","inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[[1,2],[3,4]]}]})",
      std::nullopt, nullptr);
  auto flat = ParseInferRequest(
      R"({"inputs":[{"name":"x","shape":[2,2],"datatype":"INT32","data":[1,2,3,4]}]})",
      std::nullopt, nullptr);
  ASSERT_TRUE(nested.ok()) << nested.status();
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_EQ(nested->request->id, "r1");
  EXPECT_EQ(As<int32_t>(nested->request->inputs[0].data), (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(nested->request->inputs[0].data, flat->request->inputs[0].data);
  EXPECT_EQ(nested->request->inputs[0].shape, (Shape{2, 2}));
}

TEST(InferCodecTest, NumbersConvertExactly) {
  // Values whose nearest double a fast strtod can miss, extreme exponents (the input that
  // crashed rapidjson's full-precision path: "0e44"), and 64-bit integer limits.
  const std::vector<std::string> texts = {"0.1", "2.2250738585072011e-308", "9007199254740993",
                                          "1.7976931348623157e308", "4.9e-324", "0e44",
                                          "-0.0", "123456789012345678e-20"};
  std::string data;
  for (const auto& t : texts) data += (data.empty() ? "" : ",") + t;
  auto parsed = ParseInferRequest(
      inferd::StrCat(R"({"inputs":[{"name":"x","shape":[)", texts.size(),
             R"(],"datatype":"FP64","data":[)", data, "]}]}"),
      std::nullopt, nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto got = As<double>(parsed->request->inputs[0].data);
  ASSERT_EQ(got.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    const double want = std::strtod(texts[i].c_str(), nullptr);
    EXPECT_EQ(std::memcmp(&got[i], &want, sizeof(double)), 0) << texts[i];
  }

  auto ints = ParseInferRequest(
      R"({"inputs":[{"name":"x","shape":[3],"datatype":"INT64","data":[-9223372036854775808,9223372036854775807,0]}]})",
      std::nullopt, nullptr);
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_EQ(As<int64_t>(ints->request->inputs[0].data),
            (std::vector<int64_t>{INT64_MIN, INT64_MAX, 0}));

  for (const char* text : {"2e308", "-1e400"}) {
    auto huge = ParseInferRequest(
        inferd::StrCat(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP64","data":[)", text,
                       "]}]}"),
        std::nullopt, nullptr);
    ASSERT_FALSE(huge.ok()) << text;
    EXPECT_THAT(std::string(huge.status().message()),
                ::testing::MatchesRegex("malformed JSON in the request body at offset [0-9]+: "
                                        "(number -?[0-9e]+ does not fit in a double|"
                                        "Number too big to be stored in double.)"));
  }
}

TEST(InferCodecTest, BinaryInputsAreViewsIntoTheBody) {
  std::string json =
      R"({"inputs":[{"name":"a","shape":[2],"datatype":"FP32","parameters":{"binary_data_size":8}},)"
      R"({"name":"b","shape":[1],"datatype":"INT64","parameters":{"binary_data_size":8}}],)"
      R"("outputs":[{"name":"y","parameters":{"binary_data":true}}]})";
  std::string body = json;
  float a[2] = {1.5f, -2.0f};
  int64_t b = 42;
  body.append(reinterpret_cast<char*>(a), 8);
  body.append(reinterpret_cast<char*>(&b), 8);
  auto parsed = ParseInferRequest(body, json.size(), nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto& req = *parsed->request;
  EXPECT_EQ(req.inputs[0].data.data(), body.data() + json.size());
  EXPECT_EQ(As<float>(req.inputs[0].data), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(As<int64_t>(req.inputs[1].data), (std::vector<int64_t>{42}));
  EXPECT_TRUE(parsed->encoding.IsBinary("y"));
  EXPECT_FALSE(parsed->encoding.IsBinary("z"));
}

TEST(InferCodecTest, BytesAndBoolAndFp16FromJson) {
  auto parsed = ParseInferRequest(
      R"({"inputs":[{"name":"s","shape":[2],"datatype":"BYTES","data":["hi",""]},)"
      R"({"name":"b","shape":[2],"datatype":"BOOL","data":[true,false]},)"
      R"({"name":"h","shape":[2],"datatype":"FP16","data":[1.0,-0.5]}]})",
      std::nullopt, nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  const auto& in = parsed->request->inputs;
  EXPECT_EQ(in[0].data, std::string("\x02\x00\x00\x00hi\x00\x00\x00\x00", 10));
  EXPECT_EQ(in[1].data, std::string("\x01\x00", 2));
  auto h = As<uint16_t>(in[2].data);
  EXPECT_EQ(HalfToFloat(h[0]), 1.0f);
  EXPECT_EQ(HalfToFloat(h[1]), -0.5f);
}

TEST(InferCodecTest, HalfConversionRoundTrips) {
  for (float f : {0.0f, 1.0f, -2.5f, 65504.0f, 6.1035156e-05f, 5.9604645e-08f, 0.333251953125f}) {
    EXPECT_EQ(HalfToFloat(FloatToHalf(f)), f) << f;
  }
  EXPECT_TRUE(std::isinf(HalfToFloat(FloatToHalf(1e6f))));
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
}

TEST(InferCodecTest, ErrorsNameWhatIsWrong) {
  struct Case {
    std::string body;
    std::optional<size_t> header;
    const char* message;
  } cases[] = {
      {"{not json", std::nullopt, "malformed JSON"},
      {"[]", std::nullopt, "JSON object"},
      {R"({"inputs":{}})", std::nullopt, "'inputs' array"},
      {R"({"inputs":[{"shape":[1],"datatype":"FP32","data":[1]}]})", std::nullopt, "no 'name'"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FLOAT","data":[1]}]})", std::nullopt, "unknown datatype 'FLOAT'"},
      {R"({"inputs":[{"name":"x","shape":[-1],"datatype":"FP32","data":[1]}]})", std::nullopt, "non-negative"},
      {R"({"inputs":[{"name":"x","shape":[3],"datatype":"FP32","data":[1,2]}]})", std::nullopt, "needs 3 elements but 'data' has 2"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"UINT8","data":[300]}]})", std::nullopt, "out of range"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"INT32","data":[1.5]}]})", std::nullopt, "not an integer"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":["a"]}]})", std::nullopt, "not a number"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32"}]})", std::nullopt, "neither 'data'"},
      {R"({"inputs":[{"name":"x","shape":[4611686018427387904,4],"datatype":"FP32","data":[1]}]})", std::nullopt, "too many elements"},
      {R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","parameters":{"binary_data_size":8}}]})", 0, "only 0 bytes"},
      {"{}", 100, "Inference-Header-Content-Length is 100"},
  };
  for (auto& c : cases) {
    std::string body = c.body;
    std::optional<size_t> header = c.header;
    if (header && *header == 0) header = body.size();
    auto parsed = ParseInferRequest(body, header, nullptr);
    ASSERT_FALSE(parsed.ok()) << c.body;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << c.body;
    EXPECT_THAT(parsed.status().message(), HasSubstr(c.message)) << c.body;
  }
}

TEST(InferCodecTest, UnclaimedBinaryBytesAreAnError) {
  std::string json = R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]})";
  std::string body = json + "junk";
  auto parsed = ParseInferRequest(body, json.size(), nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("4 bytes of binary data that no input claims"));
}

TEST(InferCodecTest, DeepNestingIsRejectedNotACrash) {
  std::string deep = R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":)";
  deep += std::string(100000, '[') + "1" + std::string(100000, ']') + "}]}";
  auto parsed = ParseInferRequest(deep, std::nullopt, nullptr);
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(), HasSubstr("nested too deeply"));
}

TEST(InferCodecTest, RawBodyBecomesTheOnlyInput) {
  std::string body(4 * 16 * 3, '\0');
  auto parsed = ParseRawInferRequest(body, {"INPUT0", DataType::kFp32, {16}, true}, nullptr);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->request->inputs[0].shape, (Shape{3, 16}));
  EXPECT_TRUE(parsed->encoding.binary_default);
  auto bad = ParseRawInferRequest(std::string(5, 'x'), {"INPUT0", DataType::kFp32, {16}, true}, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("whole number"));
  auto var = ParseRawInferRequest(std::string(12, '\0'), {"INPUT0", DataType::kFp32, {-1}, true}, nullptr);
  ASSERT_TRUE(var.ok()) << var.status();
  EXPECT_EQ(var->request->inputs[0].shape, (Shape{1, 3}));
}

TEST(InferCodecTest, SerializesJsonAndBinaryOutputs) {
  core::InferResponse resp;
  resp.model_name = "m";
  resp.model_version = 3;
  resp.id = "abc";
  auto data = std::make_shared<std::string>();
  float vals[2] = {0.5f, -1.0f};
  data->assign(reinterpret_cast<char*>(vals), 8);
  resp.outputs.push_back({"y", DataType::kFp32, {1, 2}, *data, data});
  OutputEncoding json_enc;
  HttpResponse http = SerializeInferResponse(resp, json_enc);
  EXPECT_EQ(http.content_type, "application/json");
  EXPECT_EQ(http.body,
            R"({"model_name":"m","model_version":"3","id":"abc","outputs":[{"name":"y","datatype":"FP32","shape":[1,2],"data":[0.5,-1.0]}]})");
  OutputEncoding bin_enc;
  bin_enc.binary_default = true;
  HttpResponse bin = SerializeInferResponse(resp, bin_enc);
  EXPECT_EQ(bin.content_type, "application/octet-stream");
  ASSERT_EQ(bin.tail.size(), 1u);
  EXPECT_EQ(bin.tail[0], *data);
  EXPECT_THAT(bin.body, HasSubstr("\"binary_data_size\":8"));
  ASSERT_EQ(bin.headers.size(), 1u);
  EXPECT_EQ(bin.headers[0].second, std::to_string(bin.body.size()));
}

TEST(InferCodecTest, StatusCodes) {
  EXPECT_EQ(HttpStatusFromStatus(absl::InvalidArgumentError("")), 400);
  EXPECT_EQ(HttpStatusFromStatus(absl::NotFoundError("")), 404);
  EXPECT_EQ(HttpStatusFromStatus(absl::UnavailableError("")), 503);
  EXPECT_EQ(HttpStatusFromStatus(absl::ResourceExhaustedError("")), 507);
  EXPECT_EQ(HttpStatusFromStatus(absl::AlreadyExistsError("")), 409);
  EXPECT_EQ(HttpStatusFromStatus(absl::InternalError("")), 500);
  HttpResponse e = ErrorResponse(absl::NotFoundError("unknown model 'x\"'"));
  EXPECT_EQ(e.status, 404);
  EXPECT_EQ(e.body, R"({"error":"unknown model 'x\"'"})");
}

}  // namespace
}  // namespace inferd::http

namespace inferd::http {
namespace {

// Issue 26: 'data' nested in any way (deeper or shallower than the shape, ragged, with empty
// arrays) is flattened in row-major order and only its element count is checked, as Triton 2.59.1
// does; a count that disagrees with the shape, or malformed text, is refused naming the input.
TEST(InferCodecNestingTest, AnyNestingIsFlattenedAndOnlyTheCountChecked) {
  auto parse = [](const char* data, const char* datatype = "INT32") {
    return ParseInferRequest(inferd::StrCat(R"({"inputs":[{"name":"x","shape":[2,3],"datatype":")",
                                            datatype, R"(","data":)", data, "}]}"),
                             std::nullopt, nullptr);
  };
  for (const char* datatype : {"INT32", "FP32", "BYTES"}) {
    const bool bytes = std::string_view(datatype) == "BYTES";
    std::vector<std::string> forms = {"[1,2,3,4,5,6]", "[[1,2,3],[4,5,6]]", " [ [1, 2,3] ,[4,5,6] ] ",
                                      "[[[1,2,3]],[[4,5,6]]]", "[[1,2],[3,4],[5,6]]",
                                      "[[1,2,3,4],[5,6]]", "[[1,2,3],4,5,6]", "[1,2,3,[4,5,6]]",
                                      "[[[[1]]],[],[2,[3,[4]]],5,[[6]]]", "[[[1,2,3,4,5,6]]]"};
    for (std::string form : forms) {
      if (bytes) {  // the DOM path: strings
        std::string quoted;
        for (char c : form) {
          if (c >= '1' && c <= '6') quoted += inferd::StrCat("\"", std::string(1, c), "\"");
          else quoted += c;
        }
        form = quoted;
      }
      auto r = parse(form.c_str(), datatype);
      ASSERT_TRUE(r.ok()) << datatype << " " << form << ": " << r.status();
      const std::string_view got = r->request->inputs[0].data;
      if (std::string_view(datatype) == "INT32") {
        EXPECT_EQ(As<int32_t>(got), (std::vector<int32_t>{1, 2, 3, 4, 5, 6})) << form;
      } else if (std::string_view(datatype) == "FP32") {
        EXPECT_EQ(As<float>(got), (std::vector<float>{1, 2, 3, 4, 5, 6})) << form;
      } else {
        EXPECT_EQ(got.size(), 6 * 5u) << form;  // six 4-byte lengths and six 1-byte strings
        EXPECT_EQ(got.substr(4, 1), "1") << form;
        EXPECT_EQ(got.substr(29, 1), "6") << form;
      }
    }
  }
  for (const char* malformed : {"[[1,2,3],[4,5,6]", "[1,2,3,4,5,6,]", "[01,2,3,4,5,6]",
                                "[1.,2,3,4,5,6]", "[[1,2,3],[4,5,6],]"}) {
    auto r = parse(malformed);
    ASSERT_FALSE(r.ok()) << malformed;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << malformed;
  }
  for (const char* miscounted : {"[[1,2,3],[4,5]]", "[[[1,2,3]],[[4,5,6,7]]]", "[[],[]]", "[[[]]]"}) {
    auto r = parse(miscounted);
    ASSERT_FALSE(r.ok()) << miscounted;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << miscounted;
    EXPECT_THAT(std::string(r.status().message()), ::testing::HasSubstr("input 'x': shape [2,3] needs 6"))
        << miscounted;
  }
  EXPECT_THAT(std::string(parse("[[[1,2,3]],[[4,5]]]").status().message()),
              ::testing::HasSubstr("input 'x': shape [2,3] needs 6 elements but 'data' has 5"));
}

// The fast_float path keeps JSON's number grammar: what JSON refuses is 400 with the offset of
// the fault, and accepted numbers are the nearest double (then cast for FP32), as strtod gives.
TEST(InferCodecJsonNumbersTest, StrictGrammarAndExactValues) {
  auto parse = [](std::string_view datatype, std::string_view data) {
    return ParseInferRequest(inferd::StrCat(R"({"inputs":[{"name":"x","shape":[1],"datatype":")",
                                            datatype, R"(","data":[)", data, "]}]}"),
                             std::nullopt, nullptr);
  };
  for (const char* bad : {"1.", "1.e5", "01", "-01", "1e", "1e+", "1.5E-", "-", "-.5", ".5", "+1",
                          "inf", "nan", "infinity", "1e-400", "2e308", "0x10", "1_0", "--1"}) {
    for (const char* dt : {"FP32", "FP64", "FP16"}) {
      auto r = parse(dt, bad);
      ASSERT_FALSE(r.ok()) << dt << " " << bad;
      EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    }
  }
  // The offsets the serial scanner gave: just past the '.', and past the exponent's sign.
  const size_t data_at = std::string_view(R"({"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[)").size();
  EXPECT_THAT(std::string(parse("FP32", "1.e5").status().message()),
              HasSubstr(inferd::StrCat("at offset ", data_at + 2, ": missing fraction part in number")));
  EXPECT_THAT(std::string(parse("FP32", "1.5E-").status().message()),
              HasSubstr(inferd::StrCat("at offset ", data_at + 5, ": missing exponent in number")));
  EXPECT_THAT(std::string(parse("FP64", "1e-400").status().message()),
              HasSubstr("number 1e-400 does not fit in a double"));
  for (const char* good : {"0", "-0", "0.0", "-0.0", "0e44", "1E5", "1.5e+3", "-2.5E-3", "4.9e-324",
                           "0.10000000149011612", "3.4028235677973366e38", "1.00000005960464477539",
                           "123456789012345678901234567890e-30", "7.0064923216240862e-46"}) {
    auto r64 = parse("FP64", good);
    ASSERT_TRUE(r64.ok()) << good << ": " << r64.status();
    const double want = std::strtod(good, nullptr);
    const double got = As<double>(r64->request->inputs[0].data)[0];
    EXPECT_EQ(std::memcmp(&got, &want, 8), 0) << good;
    auto r32 = parse("FP32", good);
    ASSERT_TRUE(r32.ok()) << good << ": " << r32.status();
    const float want32 = static_cast<float>(want);
    const float got32 = As<float>(r32->request->inputs[0].data)[0];
    EXPECT_EQ(std::memcmp(&got32, &want32, 4), 0) << good;
  }
}

// FP32 outputs are written with nine significant digits (WriteFp32): every float reads back as
// itself, across the whole range (subnormals, the largest float, each power of ten and its
// neighbours), and simple values stay short.
TEST(InferCodecJsonNumbersTest, Fp32OutputsReadBackExactly) {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f, 0.5f, 0.1f, 1e10f, 123456789.0f,
                               1e-5f, 9.99999e-6f, 3.4028235e38f, -3.4028235e38f,
                               1.17549435e-38f, 1.4e-45f, -1.4e-45f};
  for (int k = -45; k <= 38; ++k) {
    const float p10 = static_cast<float>(std::pow(10.0, k));
    for (float f = p10, i = 0; i < 4; ++i) {
      values.push_back(f);
      values.push_back(-f);
      f = std::nextafter(f, 0.0f);
    }
    values.push_back(std::nextafter(p10, 1e39f));
  }
  std::mt19937 rng(11);
  for (int i = 0; i < 200000; ++i) {
    uint32_t bits = rng();
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isfinite(f)) values.push_back(f);
  }
  core::InferResponse response;
  response.model_name = "m";
  auto& out = response.outputs.emplace_back();
  out.name = "y";
  out.datatype = DataType::kFp32;
  out.shape = {static_cast<int64_t>(values.size())};
  out.data = std::string_view(reinterpret_cast<const char*>(values.data()), values.size() * 4);
  HttpResponse http = SerializeInferResponse(response, OutputEncoding{});
  const size_t open = http.body.find("\"data\":[");
  ASSERT_NE(open, std::string::npos);
  EXPECT_EQ(http.body.substr(open, 48), "\"data\":[0.0,-0.0,1.0,-1.0,0.5,0.100000001,1e+10,");
  const char* p = http.body.c_str() + open + 8;
  for (size_t i = 0; i < values.size(); ++i) {
    char* end = nullptr;
    const float back = std::strtof(p, &end);
    ASSERT_EQ(std::memcmp(&back, &values[i], 4), 0)
        << i << ": " << values[i] << " written as " << std::string(p, end - p);
    ASSERT_TRUE(*end == ',' || *end == ']') << i;
    p = end + 1;
  }
}

// Large flat arrays are parsed in slices on several threads and large outputs written so: the
// result is the same as the serial parse element for element, errors are the serial parser's,
// and nested or too-long data still takes the serial path.
TEST(InferCodecJsonNumbersTest, LargeArraysInSlices) {
  constexpr size_t kN = 300000;  // ~6 MB of text: several slices
  std::mt19937_64 rng(7);
  std::normal_distribution<double> normal(0, 1e3);
  std::vector<std::string> texts(kN);
  char buf[64];
  for (size_t i = 0; i < kN; ++i) {
    const double v = normal(rng) * std::pow(10.0, static_cast<int>(rng() % 40) - 20);
    std::snprintf(buf, sizeof(buf), i % 3 ? "%.17g" : "%.9g", v);
    texts[i] = buf;
  }
  texts[12345] = "NaN";
  texts[200000] = "-Infinity";
  std::string data;
  data.reserve(kN * 26);
  for (size_t i = 0; i < kN; ++i) {
    if (i) data += (i % 7 == 0) ? " ,\n " : ",";
    data += texts[i];
  }
  auto request = [&](std::string_view dt, std::string_view shape, const std::string& d) {
    return inferd::StrCat(R"({"inputs":[{"name":"x","shape":[)", shape, R"(],"datatype":")", dt,
                          R"(","data":)", d, "}]}");
  };
  for (const char* dt : {"FP64", "FP32"}) {
    auto r = ParseInferRequest(request(dt, std::to_string(kN), "[ " + data + " ]"), std::nullopt,
                               nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string_view got = r->request->inputs[0].data;
    for (size_t i = 0; i < kN; ++i) {
      const double want = std::strtod(texts[i].c_str(), nullptr);
      if (std::string(dt) == "FP64") {
        double g;
        std::memcpy(&g, got.data() + i * 8, 8);
        ASSERT_TRUE(std::memcmp(&g, &want, 8) == 0 || (std::isnan(g) && std::isnan(want)))
            << i << " " << texts[i];
      } else {
        float g;
        const float w = static_cast<float>(want);
        std::memcpy(&g, got.data() + i * 4, 4);
        ASSERT_TRUE(std::memcmp(&g, &w, 4) == 0 || (std::isnan(g) && std::isnan(w)))
            << i << " " << texts[i];
      }
    }
    // Written back (in slices) and read again: the same numbers, in order.
    core::InferResponse response;
    response.model_name = "m";
    auto& out = response.outputs.emplace_back();
    out.name = "y";
    out.datatype = DataTypeFromString(dt);
    out.shape = {static_cast<int64_t>(kN)};
    const std::string copy(got);
    out.data = copy;
    HttpResponse http = SerializeInferResponse(response, OutputEncoding{});
    const size_t open = http.body.find("\"data\":[");
    ASSERT_NE(open, std::string::npos);
    auto back = ParseInferRequest(
        request(dt, std::to_string(kN), http.body.substr(open + 7, http.body.find(']', open) - open - 6)),
        std::nullopt, nullptr);
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_TRUE(back->request->inputs[0].data == got) << dt;
  }
  // Too many elements for the shape, a malformed number far in, nested like the shape: the
  // serial parser's answers.
  auto more = ParseInferRequest(request("FP64", std::to_string(kN - 1), "[" + data + "]"),
                                std::nullopt, nullptr);
  ASSERT_FALSE(more.ok());
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr(inferd::StrCat("needs ", kN - 1, " elements but 'data' has ", kN)));
  std::string bad = data;
  const size_t at = bad.find(",", bad.size() * 3 / 4) + 1;
  bad.insert(at, "01");  // "01..." : a leading zero
  const std::string body = request("FP32", std::to_string(kN), "[" + bad + "]");
  auto malformed = ParseInferRequest(body, std::nullopt, nullptr);
  ASSERT_FALSE(malformed.ok());
  EXPECT_THAT(std::string(malformed.status().message()),
              HasSubstr(inferd::StrCat("at offset ", body.find("\"data\":[") + 8 + at + 1,
                                       ": missing a comma or ']'")));
  std::string nested = "[[" + data.substr(0, data.find(',', data.size() / 2)) + "],[" +
                       data.substr(data.find(',', data.size() / 2) + 1) + "]]";
  auto rows = ParseInferRequest(request("FP64", std::to_string(kN), nested), std::nullopt, nullptr);
  // Rows of unequal length for a shape of one dimension: flattened, as Triton does (the same
  // numbers as the flat form, parsed serially).
  ASSERT_TRUE(rows.ok()) << rows.status();
  auto flat = ParseInferRequest(request("FP64", std::to_string(kN), "[" + data + "]"), std::nullopt,
                                nullptr);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_TRUE(rows->request->inputs[0].data == flat->request->inputs[0].data);
}


// The shape tensors arrive in ("-d.ddd", the way numpy and tritonclient print floats) takes a
// word-at-a-time path; every integer and fraction length it takes or leaves, leading zeros and
// both signs, read exactly as strtod reads them, in a large array (the parallel slices) and with
// numbers right at the start and the end of the document; near-misses are still refused.
TEST(InferCodecJsonNumbersTest, PlainDecimalsExactAtEveryLength) {
  std::mt19937_64 rng(11);
  std::vector<std::string> texts;
  for (int rep = 0; rep < 4000; ++rep) {
    for (int int_len = 1; int_len <= 9; ++int_len) {
      for (int frac_len = 1; frac_len <= 21; frac_len += 1 + static_cast<int>(rng() % 3)) {
        std::string t = rng() % 2 ? "-" : "";
        t += static_cast<char>(int_len == 1 ? '0' + rng() % 10 : '1' + rng() % 9);
        for (int j = 1; j < int_len; ++j) t += static_cast<char>('0' + rng() % 10);
        t += '.';
        const int zeros = rng() % 4 == 0 ? static_cast<int>(rng() % frac_len) : 0;
        for (int j = 0; j < frac_len; ++j) {
          t += static_cast<char>(j < zeros ? '0' : '0' + rng() % 10);
        }
        texts.push_back(std::move(t));
      }
    }
  }
  texts.push_back("0.0");
  texts.push_back("-0.0");
  texts.push_back("9.9999999999999999999");  // 20 digits: the general path
  std::string data = "[";
  for (size_t i = 0; i < texts.size(); ++i) {
    if (i) data += ",";
    data += texts[i];
  }
  data += "]";
  for (const char* dt : {"FP64", "FP32"}) {
    auto r = ParseInferRequest(
        inferd::StrCat(R"({"inputs":[{"name":"x","shape":[)", texts.size(), R"(],"datatype":")",
                       dt, R"(","data":)", data, "}]}"),
        std::nullopt, nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    const std::string_view got = r->request->inputs[0].data;
    for (size_t i = 0; i < texts.size(); ++i) {
      const double want = std::strtod(texts[i].c_str(), nullptr);
      if (std::string(dt) == "FP64") {
        double g;
        std::memcpy(&g, got.data() + i * 8, 8);
        ASSERT_EQ(std::memcmp(&g, &want, 8), 0) << texts[i] << " read as " << g;
      } else {
        float g;
        const float w = static_cast<float>(want);
        std::memcpy(&g, got.data() + i * 4, 4);
        ASSERT_EQ(std::memcmp(&g, &w, 4), 0) << texts[i] << " read as " << g;
      }
    }
  }
  // A short document: the numbers sit within 16 bytes of its start and 48 of its end.
  auto small = ParseInferRequest(R"({"inputs":[{"data":[-1.25,0.5],"name":"x","shape":[2],)"
                                 R"("datatype":"FP64"}]})", std::nullopt, nullptr);
  ASSERT_TRUE(small.ok()) << small.status();
  EXPECT_EQ(As<double>(small->request->inputs[0].data)[0], -1.25);
  EXPECT_EQ(As<double>(small->request->inputs[0].data)[1], 0.5);
  // Near-misses, far into a large array: refused with the general path's verdict.
  for (const char* bad : {"1.5.3", "1..5", "00.5", "-01.5", "1.5e", "1.5-", "1.-5", "--1.5",
                          "1.5x", "1.", "0.5.", "12345678.5.5"}) {
    std::string with_bad = data;
    with_bad.insert(with_bad.find(',', with_bad.size() / 3) + 1, std::string(bad) + ",");
    auto r = ParseInferRequest(
        inferd::StrCat(R"({"inputs":[{"name":"x","shape":[)", texts.size() + 1,
                       R"(],"datatype":"FP32","data":)", with_bad, "}]}"),
        std::nullopt, nullptr);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("malformed JSON")) << bad;
  }
}

}  // namespace
}  // namespace inferd::http

namespace inferd::http {
namespace {

// The envelope's small values (names, shapes, parameters) are read without rapidjson on the fast
// path when every member is a plain string, an integer of up to 18 digits or a literal, and by
// rapidjson otherwise; a 'data' array of strings sends the whole body through rapidjson. All
// must give the same request.
TEST(InferCodecTest, EnvelopeValuesReadAlikeOnBothPaths) {
  const std::vector<std::string> param_sets = {
      // all simple: the scanner's own reader
      R"("parameters":{"a":1,"b":-7,"c":0,"d":-0,"e":123456789012345678,"f":-123456789012345678,)"
      R"("i":"plain","l":true,"m":false,"priority":3,"timeout":5000})",
      // mixed: rapidjson for the object
      R"("parameters":{"a":1,"b":-7,"f":1234567890123456789012,"g":1.5,"h":-2e3,)"
      R"("j":"q\"uote\u00e9","k":"é","n":9223372036854775807,"o":-9223372036854775808,)"
      R"("priority":3,"timeout":5000})",
  };
  for (const std::string& params : param_sets) {
    const std::string fast = R"({"id":"r\"1",)" + params +
                             R"(,"inputs":[{"name":"x","shape":[ 2 , 1 ],"datatype":"INT32",)"
                             R"("data":[1,2]}]})";
    const std::string slow = R"({"id":"r\"1",)" + params +
                             R"(,"inputs":[{"name":"x","shape":[2,1],"datatype":"INT32",)"
                             R"("data":[1,2]},{"name":"s","shape":[1],"datatype":"BYTES",)"
                             R"("data":["x"]}]})";
    auto a = ParseInferRequest(fast, std::nullopt, nullptr);
    auto b = ParseInferRequest(slow, std::nullopt, nullptr);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok()) << b.status();
    EXPECT_EQ(a->request->id, "r\"1");
    EXPECT_EQ(a->request->id, b->request->id);
    EXPECT_EQ(a->request->priority, 3u);
    EXPECT_EQ(a->request->priority, b->request->priority);
    EXPECT_EQ(a->request->timeout_us, b->request->timeout_us);
    EXPECT_EQ(a->request->parameters, b->request->parameters);
    EXPECT_THAT(a->request->parameters, HasSubstr(R"("b":-7)"));
    EXPECT_EQ(a->request->inputs[0].shape, b->request->inputs[0].shape);
    EXPECT_EQ(a->request->inputs[0].name, "x");
  }
  // Not JSON (leading zeros, a bare word): refused alike.
  for (std::string bad : {R"("parameters":{"p":007})", R"("parameters":{"p":tru})"}) {
    auto a = ParseInferRequest(R"({)" + bad + R"(,"inputs":[]})", std::nullopt, nullptr);
    auto b = ParseInferRequest(
        R"({)" + bad + R"(,"inputs":[{"name":"s","shape":[1],"datatype":"BYTES","data":["x"]}]})",
        std::nullopt, nullptr);
    EXPECT_FALSE(a.ok()) << bad;
    EXPECT_FALSE(b.ok()) << bad;
  }
}

// Names past 16 bytes, with what a plain string may not hold (a quote, a backslash, a control,
// UTF-8) at every position: the scanner's 16-byte steps stop there and rapidjson reads the text.
TEST(InferCodecTest, LongNamesWithEscapesAtEveryPositionReadExactly) {
  const std::string base = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEF";  // 42 plain bytes
  const std::vector<std::pair<std::string, std::string>> specials = {
      {"\\\"", "\""}, {"\\\\", "\\"}, {"\\n", "\n"}, {"\xc3\xa9", "\xc3\xa9"}};
  for (size_t at = 0; at <= base.size(); ++at) {
    for (const auto& [json_text, value] : specials) {
      const std::string json_name = base.substr(0, at) + json_text + base.substr(at);
      const std::string name = base.substr(0, at) + value + base.substr(at);
      const std::string body = R"({"inputs":[{"name":")" + json_name +
                               R"(","shape":[1],"datatype":"INT32","data":[7]}]})";
      auto parsed = ParseInferRequest(body, std::nullopt, nullptr);
      ASSERT_TRUE(parsed.ok()) << body << ": " << parsed.status();
      EXPECT_EQ(parsed->request->inputs[0].name, name) << body;
    }
    const std::string plain = R"({"inputs":[{"name":")" + base.substr(0, at) +
                              R"(","shape":[1],"datatype":"INT32","data":[7]}]})";
    auto parsed = ParseInferRequest(plain, std::nullopt, nullptr);
    ASSERT_TRUE(parsed.ok()) << plain << ": " << parsed.status();
    EXPECT_EQ(parsed->request->inputs[0].name, base.substr(0, at));
  }
}

}  // namespace
}  // namespace inferd::http

namespace inferd::http {
namespace {

// The header of an all-binary response is written by hand (the fast path); it must be the
// text rapidjson's Writer gives for the same response, escapes included.
TEST(SerializeInferResponseTest, BinaryOnlyHeaderIsRapidjsonsText) {
  for (const std::string name : {std::string("plain"), std::string("q\"uo\\te/\x01\x1f\b\f\n\r\t"),
                                 std::string("caf\xc3\xa9 \x7f"), std::string()}) {
    core::InferResponse resp;
    resp.model_name = "m" + name;
    resp.model_version = 12;
    resp.id = name.empty() ? "" : "id" + name;
    static const std::string kBytes(24, '\x07');
    resp.outputs.reserve(2);
    auto& a = resp.outputs.emplace_back();
    a.name = "A" + name;
    a.datatype = DataType::kFp32;
    a.shape = {2, 3};
    a.data = kBytes;
    auto& b = resp.outputs.emplace_back();
    b.name = "B";
    b.datatype = DataType::kBytes;
    b.shape = {};
    b.in_shared_memory = true;
    OutputEncoding enc;
    enc.binary_default = true;

    rapidjson::StringBuffer buf;
    rapidjson::Writer<rapidjson::StringBuffer> w(buf);
    w.StartObject();
    w.Key("model_name");
    w.String(resp.model_name.c_str(), resp.model_name.size());
    w.Key("model_version");
    w.String("12");
    if (!resp.id.empty()) {
      w.Key("id");
      w.String(resp.id.c_str(), resp.id.size());
    }
    w.Key("outputs");
    w.StartArray();
    w.StartObject();
    w.Key("name");
    w.String(a.name.c_str(), a.name.size());
    w.Key("datatype");
    w.String("FP32");
    w.Key("shape");
    w.StartArray();
    w.Int64(2);
    w.Int64(3);
    w.EndArray();
    w.Key("parameters");
    w.StartObject();
    w.Key("binary_data_size");
    w.Uint64(24);
    w.EndObject();
    w.EndObject();
    w.StartObject();
    w.Key("name");
    w.String("B");
    w.Key("datatype");
    w.String("BYTES");
    w.Key("shape");
    w.StartArray();
    w.EndArray();
    w.EndObject();
    w.EndArray();
    w.EndObject();

    HttpResponse http = SerializeInferResponse(resp, enc);
    EXPECT_EQ(http.body, std::string(buf.GetString(), buf.GetSize()));
    EXPECT_EQ(http.content_type, "application/octet-stream");
    ASSERT_EQ(http.tail.size(), 1u);
    EXPECT_EQ(http.tail[0], a.data);
    ASSERT_EQ(http.headers.size(), 1u);
    EXPECT_EQ(http.headers[0].second, std::to_string(http.body.size()));
  }
}

}  // namespace
}  // namespace inferd::http
