#include "frontends/http/infer_codec.h"

#include "common/http_status_hint.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "absl/container/inlined_vector.h"
#include "common/strings.h"
#include "core/request_parameters.h"
#include "frontends/http/json_tensor.h"
#include "rapidjson/document.h"
#include "rapidjson/encodedstream.h"
#include "rapidjson/error/en.h"
#include "rapidjson/memorystream.h"
#include "rapidjson/reader.h"
#include "rapidjson/stringbuffer.h"
#include "rapidjson/writer.h"

namespace inferd::http {
namespace {

using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer, rapidjson::UTF8<>, rapidjson::UTF8<>,
                                     rapidjson::CrtAllocator, rapidjson::kWriteNanAndInfFlag>;
constexpr int kMaxJsonDataDepth = 64;

absl::Status Invalid(std::string_view input, std::string_view what) {
  return absl::InvalidArgumentError(inferd::StrCat("input '", input, "': ", what));
}

// Forwards SAX events to a Document, converting numbers itself: the reader hands them over as
// text (kParseNumbersAsStringsFlag) and std::from_chars turns them into the nearest double or an
// exact integer. This keeps FP64 tensors bit-exact without rapidjson's full-precision strtod,
// which overflows a signed integer on some inputs (found by fuzz/infer_codec_fuzz).
class ExactNumberHandler {
 public:
  explicit ExactNumberHandler(rapidjson::Document& doc) : doc_(doc) {}

  bool Null() { return doc_.Null(); }
  bool Bool(bool b) { return doc_.Bool(b); }
  bool Int(int i) { return doc_.Int(i); }
  bool Uint(unsigned i) { return doc_.Uint(i); }
  bool Int64(int64_t i) { return doc_.Int64(i); }
  bool Uint64(uint64_t i) { return doc_.Uint64(i); }
  bool Double(double d) { return doc_.Double(d); }
  bool String(const char* s, rapidjson::SizeType n, bool copy) { return doc_.String(s, n, copy); }
  bool StartObject() { return doc_.StartObject(); }
  bool Key(const char* s, rapidjson::SizeType n, bool copy) { return doc_.Key(s, n, copy); }
  bool EndObject(rapidjson::SizeType n) { return doc_.EndObject(n); }
  bool StartArray() { return doc_.StartArray(); }
  bool EndArray(rapidjson::SizeType n) { return doc_.EndArray(n); }

  bool RawNumber(const char* s, rapidjson::SizeType n, bool /*copy*/) {
    const std::string_view text(s, n);
    const bool integral = text.find_first_of(".eEIN") == std::string_view::npos;
    if (integral) {
      if (text.front() == '-') {
        int64_t v = 0;
        auto r = std::from_chars(s, s + n, v);
        if (r.ec == std::errc() && r.ptr == s + n) return doc_.Int64(v);
      } else {
        uint64_t v = 0;
        auto r = std::from_chars(s, s + n, v);
        if (r.ec == std::errc() && r.ptr == s + n) return doc_.Uint64(v);
      }
      // Integers beyond 64 bits become doubles, as rapidjson itself does.
    }
    double d = 0;
    auto r = std::from_chars(s, s + n, d);
    if (r.ec != std::errc() || r.ptr != s + n) {
      bad_number_.assign(text);
      return false;
    }
    return doc_.Double(d);
  }

  const std::string& bad_number() const { return bad_number_; }

 private:
  rapidjson::Document& doc_;
  std::string bad_number_;
};

// Parses `json` into `doc`; numbers are converted exactly (see ExactNumberHandler).
absl::Status ParseJsonExact(std::string_view json, rapidjson::Document& doc) {
  constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag |
                              rapidjson::kParseNumbersAsStringsFlag |
                              rapidjson::kParseValidateEncodingFlag;
  rapidjson::Reader reader;
  rapidjson::MemoryStream ms(json.data(), json.size());
  rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> is(ms);
  ExactNumberHandler handler(doc);
  auto generate = [&](rapidjson::Document&) {
    return !reader.Parse<kFlags>(is, handler).IsError();
  };
  doc.Populate(generate);
  if (!reader.HasParseError()) return absl::OkStatus();
  if (!handler.bad_number().empty()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "malformed JSON in the request body at offset ", reader.GetErrorOffset(), ": number ",
        handler.bad_number(), " does not fit in a double"));
  }
  return absl::InvalidArgumentError(inferd::StrCat(
      "malformed JSON in the request body at offset ", reader.GetErrorOffset(), ": ",
      rapidjson::GetParseError_En(reader.GetParseErrorCode())));
}

// The fast path for a request's JSON: the envelope (a top-level object whose 'inputs' are objects)
// is walked here, every other value parsed by rapidjson as above, and each input's 'data' array
// only located (its text span in `data_spans`, by input index; an empty array stands in the DOM):
// ParseJsonTensorData parses it into the tensor once the datatype and shape are known. Anything
// unusual (escaped keys, a 'data' holding strings or objects, malformed text) falls back to
// ParseJsonExact of the whole body, which gives the same document and the usual errors.
// An input's 'data' array as the scanner found it: its text ('[' to ']'), and whether it holds
// no nested array.
struct JsonDataSpan {
  std::string_view text;
  bool flat = false;
};

// The bytes a plain string (a key or a simple value) may hold as they are: printable ASCII
// other than '"' and '\\' (an escape, a control or a UTF-8 sequence sends the text to rapidjson).
struct PlainJsonChars {
  bool plain[256] = {};
  constexpr PlainJsonChars() {
    for (int c = 0x20; c < 0x80; ++c) plain[c] = c != '"' && c != '\\';
  }
};
constexpr PlainJsonChars kPlainJson;

class InferJsonScanner {
 public:
  InferJsonScanner(std::string_view json, rapidjson::Document& doc,
                   std::vector<JsonDataSpan>* data_spans)
      : json_(json), doc_(doc), spans_(data_spans) {}

  // False: take the fallback.
  bool Scan() {
    doc_.SetObject();
    Space();
    if (!Eat('{')) return false;
    Space();
    if (Eat('}')) return AtEnd();
    for (;;) {
      std::string_view key;
      if (!Key(&key)) return false;
      if (key == "inputs" && Peek() == '[') {
        rapidjson::Value inputs(rapidjson::kArrayType);
        if (!Inputs(&inputs)) return false;
        AddMember(doc_, key, inputs);
      } else {
        rapidjson::Value v;
        if (!Value(&v)) return false;
        AddMember(doc_, key, v);
      }
      Space();
      if (Eat(',')) {
        Space();
        continue;
      }
      if (Eat('}')) return AtEnd();
      return false;
    }
  }

 private:
  char Peek() const { return pos_ < json_.size() ? json_[pos_] : '\0'; }
  bool Eat(char c) {
    if (Peek() != c) return false;
    ++pos_;
    return true;
  }
  void Space() {
    while (pos_ < json_.size() &&
           (json_[pos_] == ' ' || json_[pos_] == '\n' || json_[pos_] == '\r' || json_[pos_] == '\t')) {
      ++pos_;
    }
  }
  bool AtEnd() {
    Space();
    return pos_ == json_.size();
  }
  // Names and plain strings point into `json_` rather than being copied: the document lives no
  // longer than the text it is parsed from (ParseInferRequest holds both).
  void AddMember(rapidjson::Value& obj, std::string_view key, rapidjson::Value& v) {
    rapidjson::Value k(rapidjson::StringRef(key.data(), static_cast<rapidjson::SizeType>(key.size())));
    obj.AddMember(k, v, doc_.GetAllocator());
  }
  // A plain key (printable ASCII, no escapes) and its ':'.
  bool Key(std::string_view* key) {
    if (!Eat('"')) return false;
    const size_t start = pos_;
    if (!PlainString()) return false;
    *key = json_.substr(start, pos_ - 1 - start);
    Space();
    if (!Eat(':')) return false;
    Space();
    return true;
  }
  // The rest of a string whose opening '"' is eaten, up to and past its closing '"'; false where
  // it holds anything but plain characters or has no end.
  bool PlainString() {
    const char* p = json_.data() + pos_;
    const char* const end = json_.data() + json_.size();
#if defined(__SSE2__)
    // 16 bytes at a time: a signed compare below 0x20 finds the controls and every byte of
    // 0x80 and up (negative), two more compares the quote and the backslash.
    const __m128i space = _mm_set1_epi8(0x20);
    const __m128i quote = _mm_set1_epi8('"');
    const __m128i backslash = _mm_set1_epi8('\\');
    while (end - p >= 16) {
      const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
      const __m128i stop =
          _mm_or_si128(_mm_cmplt_epi8(v, space),
                       _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)));
      const int mask = _mm_movemask_epi8(stop);
      if (mask != 0) {
        p += __builtin_ctz(static_cast<unsigned>(mask));
        break;
      }
      p += 16;
    }
#endif
    while (p < end && kPlainJson.plain[static_cast<unsigned char>(*p)]) ++p;
    pos_ = static_cast<size_t>(p - json_.data());
    return Eat('"');
  }
  // Any value into the document's allocator: the shapes requests are made of here (see
  // SimpleValue), anything else by rapidjson (exact numbers).
  bool Value(rapidjson::Value* out) {
    const size_t start = pos_;
    if (SimpleValue(out, 0)) return true;
    pos_ = start;
    return ParsedValue(out);
  }
  static bool IsDigit(char c) { return c >= '0' && c <= '9'; }
  // Containers nest this deep at most in SimpleValue: 'outputs' is an array of objects whose
  // 'parameters' is an object of scalars (depths 0, 1 and 2).
  static constexpr int kMaxSimpleDepth = 3;
  // A string of printable ASCII with no escape, an integer of up to 18 digits, true, false,
  // null, or arrays and objects of those nested kMaxSimpleDepth deep at most: what names,
  // datatypes, shapes, parameters and requested outputs are. False for anything else, which Value() hands to rapidjson from the start:
  // a rapidjson Document and Reader per value cost ~1,000 instructions and 4 allocations, the
  // most of a small request's parse. Builds what ExactNumberHandler would (Int64 for a negative
  // integer, Uint64 otherwise).
  bool SimpleValue(rapidjson::Value* out, int depth) {
    const char c = Peek();
    if (c == '"') {
      const size_t start = ++pos_;
      if (!PlainString()) return false;
      out->SetString(rapidjson::StringRef(json_.data() + start,
                                          static_cast<rapidjson::SizeType>(pos_ - 1 - start)));
      return true;
    }
    if (c == '-' || IsDigit(c)) {
      const bool negative = c == '-';
      size_t p = pos_ + (negative ? 1 : 0);
      const size_t digits_start = p;
      uint64_t v = 0;
      while (p < json_.size() && IsDigit(json_[p]) && p - digits_start < 19) {
        v = v * 10 + static_cast<uint64_t>(json_[p] - '0');
        ++p;
      }
      const size_t digits = p - digits_start;
      if (digits == 0 || digits > 18 || (digits > 1 && json_[digits_start] == '0')) return false;
      if (p < json_.size() && (IsDigit(json_[p]) || json_[p] == '.' || json_[p] == 'e' ||
                               json_[p] == 'E')) {
        return false;
      }
      pos_ = p;
      if (negative) {
        out->SetInt64(-static_cast<int64_t>(v));
      } else {
        out->SetUint64(v);
      }
      return true;
    }
    if (c == 't' || c == 'f' || c == 'n') {
      for (auto [word, type] : {std::pair{std::string_view("true"), rapidjson::kTrueType},
                                std::pair{std::string_view("false"), rapidjson::kFalseType},
                                std::pair{std::string_view("null"), rapidjson::kNullType}}) {
        if (json_.substr(pos_, word.size()) == word) {
          pos_ += word.size();
          *out = rapidjson::Value(type);
          return true;
        }
      }
      return false;
    }
    if (depth >= kMaxSimpleDepth) return false;
    if (Eat('[')) {
      out->SetArray();
      Space();
      if (Eat(']')) return true;
      for (;;) {
        rapidjson::Value v;
        if (!SimpleValue(&v, depth + 1)) return false;
        out->PushBack(v, doc_.GetAllocator());
        Space();
        if (Eat(',')) {
          Space();
          continue;
        }
        return Eat(']');
      }
    }
    if (Eat('{')) {
      out->SetObject();
      Space();
      if (Eat('}')) return true;
      for (;;) {
        std::string_view key;
        if (!Key(&key)) return false;
        rapidjson::Value v;
        if (!SimpleValue(&v, depth + 1)) return false;
        AddMember(*out, key, v);
        Space();
        if (Eat(',')) {
          Space();
          continue;
        }
        return Eat('}');
      }
    }
    return false;
  }
  // Any value, by rapidjson (exact numbers), into the document's allocator.
  bool ParsedValue(rapidjson::Value* out) {
    constexpr unsigned kFlags = rapidjson::kParseIterativeFlag | rapidjson::kParseNanAndInfFlag |
                                rapidjson::kParseNumbersAsStringsFlag |
                                rapidjson::kParseValidateEncodingFlag |
                                rapidjson::kParseStopWhenDoneFlag;
    rapidjson::Document sub(&doc_.GetAllocator());
    rapidjson::Reader reader;
    rapidjson::MemoryStream ms(json_.data() + pos_, json_.size() - pos_);
    rapidjson::EncodedInputStream<rapidjson::UTF8<>, rapidjson::MemoryStream> is(ms);
    ExactNumberHandler handler(sub);
    bool ok = false;
    auto generate = [&](rapidjson::Document&) {
      ok = !reader.Parse<kFlags>(is, handler).IsError();
      return ok;
    };
    sub.Populate(generate);
    if (!ok || reader.HasParseError()) return false;
    pos_ += ms.Tell();
    out->Swap(sub);
    return true;
  }
  bool Inputs(rapidjson::Value* inputs) {
    Eat('[');
    Space();
    if (Eat(']')) return true;
    for (;;) {
      if (!Eat('{')) return false;
      rapidjson::Value obj(rapidjson::kObjectType);
      const size_t index = inputs->Size();
      Space();
      if (!Eat('}')) {
        for (;;) {
          std::string_view key;
          if (!Key(&key)) return false;
          if (key == "data" && Peek() == '[') {
            const size_t start = pos_;
            bool flat = false;
            if (!SkipNumberArray(&flat)) return false;
            if (spans_->size() <= index) spans_->resize(index + 1);
            (*spans_)[index] = {json_.substr(start, pos_ - start), flat};
            rapidjson::Value placeholder(rapidjson::kArrayType);
            AddMember(obj, key, placeholder);
          } else {
            rapidjson::Value v;
            if (!Value(&v)) return false;
            AddMember(obj, key, v);
          }
          Space();
          if (Eat(',')) {
            Space();
            continue;
          }
          if (Eat('}')) break;
          return false;
        }
      }
      inputs->PushBack(obj, doc_.GetAllocator());
      Space();
      if (Eat(',')) {
        Space();
        continue;
      }
      return Eat(']');
    }
  }
  // Past the array at pos_ when it holds only numbers, literals and arrays (no strings or
  // objects: those take the fallback); *flat when it holds no array. The numbers themselves are
  // checked when parsed.
  bool SkipNumberArray(bool* flat) {
    int depth = 0;
    int max_depth = 0;
    const char* p = json_.data() + pos_;
    const char* const end = json_.data() + json_.size();
    while (p < end) {
#if defined(__SSE2__)
      // 64 bytes at a time while none is a bracket, brace or quote: OR 0x20 maps '[' and ']' onto
      // '{' and '}' (and a control character onto '"', which ends the fast scan too), so three
      // compares a block find all five.
      const __m128i lower = _mm_set1_epi8(0x20);
      const __m128i brace_open = _mm_set1_epi8('{');
      const __m128i brace_close = _mm_set1_epi8('}');
      const __m128i quote = _mm_set1_epi8('"');
      auto hits = [&](const char* q) {
        const __m128i v =
            _mm_or_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), lower);
        const __m128i braces =
            _mm_or_si128(_mm_cmpeq_epi8(v, brace_open), _mm_cmpeq_epi8(v, brace_close));
        return _mm_or_si128(braces, _mm_cmpeq_epi8(v, quote));
      };
      while (end - p >= 64) {
        const __m128i any = _mm_or_si128(_mm_or_si128(hits(p), hits(p + 16)),
                                         _mm_or_si128(hits(p + 32), hits(p + 48)));
        if (_mm_movemask_epi8(any) != 0) break;
        p += 64;
      }
      while (end - p >= 16) {
        const int mask = _mm_movemask_epi8(hits(p));
        if (mask != 0) {
          p += __builtin_ctz(static_cast<unsigned>(mask));
          break;
        }
        p += 16;
      }
      if (p >= end) break;
#endif
      const char c = *p++;
      if (c == '[') {
        max_depth = std::max(max_depth, ++depth);
      } else if (c == ']') {
        if (--depth == 0) {
          pos_ = p - json_.data();
          *flat = max_depth == 1;
          return true;
        }
      } else if (c == '"' || c == '{' || c == '}') {
        return false;
      }
    }
    return false;
  }

  std::string_view json_;
  rapidjson::Document& doc_;
  std::vector<JsonDataSpan>* spans_;
  size_t pos_ = 0;
};

// Parses an infer request's JSON: the fast scanner, else the whole document by rapidjson.
absl::Status ParseInferJson(std::string_view json, rapidjson::Document& doc,
                            std::vector<JsonDataSpan>* data_spans) {
  InferJsonScanner scanner(json, doc, data_spans);
  if (scanner.Scan()) return absl::OkStatus();
  data_spans->clear();
  doc.SetNull();
  return ParseJsonExact(json, doc);
}

template <typename T>
void AppendPod(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(T));
}

template <typename T>
absl::Status AppendInt(const rapidjson::Value& v, std::string_view name, std::string* out) {
  if (v.IsInt64()) {
    int64_t x = v.GetInt64();
    if constexpr (std::is_signed_v<T>) {
      if (x < std::numeric_limits<T>::min() || x > std::numeric_limits<T>::max()) {
        return Invalid(name, inferd::StrCat("value ", x, " is out of range for its datatype"));
      }
    } else {
      if (x < 0 || static_cast<uint64_t>(x) > std::numeric_limits<T>::max()) {
        return Invalid(name, inferd::StrCat("value ", x, " is out of range for its datatype"));
      }
    }
    AppendPod<T>(out, static_cast<T>(x));
    return absl::OkStatus();
  }
  if (v.IsUint64()) {
    uint64_t x = v.GetUint64();
    if (x > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return Invalid(name, inferd::StrCat("value ", x, " is out of range for its datatype"));
    }
    AppendPod<T>(out, static_cast<T>(x));
    return absl::OkStatus();
  }
  return Invalid(name, "'data' holds a value that is not an integer");
}

absl::Status AppendElement(const rapidjson::Value& v, DataType type, std::string_view name,
                           std::string* out) {
  switch (type) {
    case DataType::kBool:
      if (!v.IsBool()) return Invalid(name, "BOOL 'data' must hold true or false");
      out->push_back(v.GetBool() ? 1 : 0);
      return absl::OkStatus();
    case DataType::kUint8: return AppendInt<uint8_t>(v, name, out);
    case DataType::kUint16: return AppendInt<uint16_t>(v, name, out);
    case DataType::kUint32: return AppendInt<uint32_t>(v, name, out);
    case DataType::kUint64: return AppendInt<uint64_t>(v, name, out);
    case DataType::kInt8: return AppendInt<int8_t>(v, name, out);
    case DataType::kInt16: return AppendInt<int16_t>(v, name, out);
    case DataType::kInt32: return AppendInt<int32_t>(v, name, out);
    case DataType::kInt64: return AppendInt<int64_t>(v, name, out);
    case DataType::kFp16:
    case DataType::kBf16:
    case DataType::kFp32:
    case DataType::kFp64: {
      if (!v.IsNumber()) return Invalid(name, "'data' holds a value that is not a number");
      const double d = v.GetDouble();
      if (type == DataType::kFp64) AppendPod<double>(out, d);
      else if (type == DataType::kFp32) AppendPod<float>(out, static_cast<float>(d));
      else if (type == DataType::kFp16) AppendPod<uint16_t>(out, FloatToHalf(static_cast<float>(d)));
      else AppendPod<uint16_t>(out, FloatToBf16(static_cast<float>(d)));
      return absl::OkStatus();
    }
    case DataType::kBytes: {
      if (!v.IsString()) return Invalid(name, "BYTES 'data' must hold strings");
      AppendPod<uint32_t>(out, v.GetStringLength());
      out->append(v.GetString(), v.GetStringLength());
      return absl::OkStatus();
    }
    default:
      return Invalid(name, "unsupported datatype");
  }
}

// Flattens `data` in row-major order, nested in any way (json_tensor.h's rule: only the element
// count is checked, by the caller).
absl::Status Flatten(const rapidjson::Value& v, DataType type, std::string_view name, int depth,
                     std::string* out, int64_t* count) {
  if (depth > kMaxJsonDataDepth) return Invalid(name, "'data' is nested too deeply");
  if (v.IsArray()) {
    for (const auto& e : v.GetArray()) {
      absl::Status st = Flatten(e, type, name, depth + 1, out, count);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  }
  ++*count;
  return AppendElement(v, type, name, out);
}

absl::StatusOr<Shape> ParseShape(const rapidjson::Value& v, std::string_view name) {
  if (!v.IsArray()) return Invalid(name, "'shape' must be an array of integers");
  Shape shape;
  for (const auto& d : v.GetArray()) {
    if (!d.IsInt64() || d.GetInt64() < 0) {
      return Invalid(name, "'shape' must hold non-negative integers");
    }
    shape.push_back(d.GetInt64());
  }
  return shape;
}

// A boolean parameter's value: false where `v` is null (absent).
absl::StatusOr<bool> BoolParam(const rapidjson::Value* v, std::string_view key,
                                std::string_view where) {
  if (v == nullptr) return false;
  if (!v->IsBool()) {
    return absl::InvalidArgumentError(
        inferd::StrCat(where, ": parameter '", key, "' must be a boolean"));
  }
  return v->GetBool();
}

absl::StatusOr<bool> GetBoolParam(const rapidjson::Value& params, const char* key,
                                  std::string_view where) {
  auto it = params.FindMember(key);
  return BoolParam(it == params.MemberEnd() ? nullptr : &it->value, key, where);
}

// Shortest round-trip form via std::to_chars (rapidjson's Grisu code trips UBSan on some
// inputs); floats print as floats ("0.1", not "0.10000000149011612").
template <typename T>
void WriteNumber(JsonWriter& w, T v) {
  if (std::isnan(v)) {
    w.RawValue("NaN", 3, rapidjson::kNumberType);
  } else if (std::isinf(v)) {
    if (v > 0) w.RawValue("Infinity", 8, rapidjson::kNumberType);
    else w.RawValue("-Infinity", 9, rapidjson::kNumberType);
  } else {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    std::string_view text(buf, end - buf);
    // Keep a decimal point or exponent so clients read a float, as JSON writers do.
    if (text.find_first_of(".eE") == std::string_view::npos) {
      std::string withdot(text);
      withdot += ".0";
      w.RawValue(withdot.data(), withdot.size(), rapidjson::kNumberType);
    } else {
      w.RawValue(text.data(), text.size(), rapidjson::kNumberType);
    }
  }
}

void WriteOutputData(JsonWriter& w, const core::OutputTensor& out) {
  w.StartArray();
  const char* p = out.data.data();
  const size_t size = DataTypeSize(out.datatype);
  const size_t n = size ? out.data.size() / size : 0;
  for (size_t i = 0; i < n; ++i, p += size) {
    switch (out.datatype) {
      case DataType::kBool: w.Bool(*p != 0); break;
      case DataType::kUint8: w.Uint(static_cast<uint8_t>(*p)); break;
      case DataType::kInt8: w.Int(static_cast<int8_t>(*p)); break;
#define INFERD_CASE(T, DT, CALL) \
  case DT: {                     \
    T x;                         \
    std::memcpy(&x, p, sizeof(T)); \
    w.CALL(x);                   \
    break;                       \
  }
      INFERD_CASE(uint16_t, DataType::kUint16, Uint)
      INFERD_CASE(uint32_t, DataType::kUint32, Uint)
      INFERD_CASE(uint64_t, DataType::kUint64, Uint64)
      INFERD_CASE(int16_t, DataType::kInt16, Int)
      INFERD_CASE(int32_t, DataType::kInt32, Int)
      INFERD_CASE(int64_t, DataType::kInt64, Int64)
#undef INFERD_CASE
      case DataType::kFp64: {
        double x;
        std::memcpy(&x, p, 8);
        WriteNumber(w, x);
        break;
      }
      case DataType::kFp32: {
        float x;
        std::memcpy(&x, p, 4);
        WriteNumber(w, x);
        break;
      }
      case DataType::kFp16: {
        uint16_t x;
        std::memcpy(&x, p, 2);
        WriteNumber(w, HalfToFloat(x));
        break;
      }
      case DataType::kBf16: {
        uint16_t x;
        std::memcpy(&x, p, 2);
        WriteNumber(w, Bf16ToFloat(x));
        break;
      }
      default: break;
    }
  }
  if (out.datatype == DataType::kBytes) {
    size_t pos = 0;
    const std::string_view d = out.data;
    while (pos + 4 <= d.size()) {
      uint32_t len;
      std::memcpy(&len, d.data() + pos, 4);
      pos += 4;
      if (len > d.size() - pos) break;
      w.String(d.data() + pos, len);
      pos += len;
    }
  }
  w.EndArray();
}

}  // namespace

// A parameter is a bool, an integer, a double or a string, as in Triton (and as gRPC's
// InferParameter can only be). Refusing objects and arrays here also means no client value
// deeper than one level is ever walked by rapidjson's recursive Accept: a request nesting
// its parameters 87,500 levels deep overflowed the stack when they were written back out.
static absl::Status CheckScalarParameters(const rapidjson::Value& params) {
  for (const auto& m : params.GetObject()) {
    if (m.value.IsObject() || m.value.IsArray() || m.value.IsNull()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "parameter '", std::string_view(m.name.GetString(), m.name.GetStringLength()),
          "' has invalid type: it must be a bool, an integer, a double or a string"));
    }
  }
  return absl::OkStatus();
}

// A JSON parameter value in the protocols' common form (core/request_parameters.h).
static core::ParameterValue ToParameterValue(const rapidjson::Value& v) {
  core::ParameterValue p;
  using Kind = core::ParameterValue::Kind;
  if (v.IsBool()) {
    p.kind = Kind::kBool;
    p.boolean = v.GetBool();
  } else if (v.IsUint64()) {
    p.kind = Kind::kUint64;
    p.uint64 = v.GetUint64();
  } else if (v.IsInt64()) {
    p.kind = Kind::kInt64;
    p.int64 = v.GetInt64();
  } else if (v.IsNumber()) {
    p.kind = Kind::kDouble;
    p.number = v.GetDouble();
  } else if (v.IsString()) {
    p.kind = Kind::kString;
    p.text = std::string_view(v.GetString(), v.GetStringLength());
  }
  return p;
}

// The first member of `obj` named by each of `keys` (null where none is), in one pass over the
// members: a FindMember per key walks them again for each key. rapidjson's FindMember also
// returns the first of duplicate names.
template <size_t N>
static std::array<const rapidjson::Value*, N> FindMembers(
    const rapidjson::Value& obj, const std::array<std::string_view, N>& keys) {
  std::array<const rapidjson::Value*, N> found{};
  for (const auto& m : obj.GetObject()) {
    const std::string_view name(m.name.GetString(), m.name.GetStringLength());
    for (size_t i = 0; i < N; ++i) {
      if (found[i] == nullptr && name == keys[i]) {
        found[i] = &m.value;
        break;
      }
    }
  }
  return found;
}

// The shared-memory extension's parameters of one tensor (`kind` "input" or "output", named
// `name` in errors), given its 'shared_memory_region', 'shared_memory_offset' and
// 'shared_memory_byte_size' (null where absent): nullopt without any of them (the common case);
// 'shared_memory_byte_size' is required with the region.
static absl::StatusOr<std::optional<core::SharedMemoryRef>> ParseSharedMemoryParams(
    const rapidjson::Value* region, const rapidjson::Value* offset, const rapidjson::Value* size,
    std::string_view kind, const std::string& name) {
  if (region == nullptr && offset == nullptr && size == nullptr) {
    return std::optional<core::SharedMemoryRef>();
  }
  core::ParameterValue values[3];
  const core::ParameterValue* found[3] = {nullptr, nullptr, nullptr};
  const rapidjson::Value* given[3] = {region, offset, size};
  for (int i = 0; i < 3; ++i) {
    if (given[i] != nullptr) {
      values[i] = ToParameterValue(*given[i]);
      found[i] = &values[i];
    }
  }
  return core::ParseSharedMemoryParameters(found[0], found[1], found[2], core::kJsonParameterWords,
                                           inferd::StrCat(kind, " '", name, "'"));
}

bool OutputEncoding::IsBinary(std::string_view name) const {
  for (const auto& [n, b] : per_output) {
    if (n == name) return b;
  }
  return binary_default;
}

absl::StatusOr<ParsedInfer> ParseInferRequest(std::string_view body,
                                              std::optional<size_t> header_length,
                                              std::shared_ptr<const void> owner) {
  std::string_view json = body;
  std::string_view binary;
  if (header_length) {
    if (*header_length > body.size()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "Inference-Header-Content-Length is ", *header_length, " but the body has only ",
          body.size(), " bytes"));
    }
    json = body.substr(0, *header_length);
    binary = body.substr(*header_length);
  }
  // A small request's document fits in a buffer on the stack (no allocation); larger ones go
  // on in chunks from the heap.
  char pool[8192];
  rapidjson::MemoryPoolAllocator<> allocator(pool, sizeof(pool));
  rapidjson::Document doc(&allocator);
  std::vector<JsonDataSpan> data_spans;  // by input index: 'data' left for the fast parser
  if (auto st = ParseInferJson(json, doc, &data_spans); !st.ok()) return st;
  if (!doc.IsObject()) return absl::InvalidArgumentError("the request body must be a JSON object");

  ParsedInfer parsed;
  parsed.request = std::make_unique<core::InferRequest>();
  core::InferRequest& req = *parsed.request;
  req.payload = std::move(owner);

  const auto [id_v, params_v, inputs_v, outputs_v] =
      FindMembers<4>(doc, {"id", "parameters", "inputs", "outputs"});
  if (id_v != nullptr) {
    if (!id_v->IsString()) return absl::InvalidArgumentError("'id' must be a string");
    req.id.assign(id_v->GetString(), id_v->GetStringLength());
  }
  if (params_v != nullptr) {
    const auto& params = *params_v;
    if (!params.IsObject()) return absl::InvalidArgumentError("'parameters' must be an object");
    if (auto st = CheckScalarParameters(params); !st.ok()) return st;
    auto b = GetBoolParam(params, "binary_data_output", "request");
    if (!b.ok()) return b.status();
    parsed.encoding.binary_default = *b;
    // The ones the server reads (core/request_parameters.h); the rest travel with the request
    // (Triton's Python backend: request.parameters()), written out only when there are any.
    absl::InlinedVector<const rapidjson::Value::Member*, 8> rest;
    for (const auto& m : params.GetObject()) {
      const std::string_view k(m.name.GetString(), m.name.GetStringLength());
      auto taken = core::ApplyRequestParameter(k, ToParameterValue(m.value),
                                               core::kJsonParameterWords, &req);
      if (!taken.ok()) return taken.status();
      if (!*taken) rest.push_back(&m);
    }
    if (!rest.empty()) {
      rapidjson::StringBuffer text;
      rapidjson::Writer<rapidjson::StringBuffer> rw(text);
      rw.StartObject();
      for (const auto* m : rest) {
        rw.Key(m->name.GetString(), m->name.GetStringLength());
        m->value.Accept(rw);
      }
      rw.EndObject();
      req.parameters.assign(text.GetString(), text.GetSize());
    }
  }

  if (inputs_v == nullptr || !inputs_v->IsArray()) {
    return absl::InvalidArgumentError("the request must have an 'inputs' array");
  }
  const auto& inputs = *inputs_v;
  size_t binary_offset = 0;
  req.inputs.reserve(inputs.Size());
  for (const auto& in : inputs.GetArray()) {
    if (!in.IsObject()) return absl::InvalidArgumentError("each entry of 'inputs' must be an object");
    const auto [name_v, dt_v, shape_v, in_params_v, data_v] =
        FindMembers<5>(in, {"name", "datatype", "shape", "parameters", "data"});
    if (name_v == nullptr || !name_v->IsString()) {
      return absl::InvalidArgumentError("an input has no 'name' string");
    }
    core::InputTensor tensor;
    tensor.name.assign(name_v->GetString(), name_v->GetStringLength());
    if (dt_v == nullptr || !dt_v->IsString()) {
      return Invalid(tensor.name, "missing 'datatype'");
    }
    tensor.datatype = DataTypeFromString(std::string_view(dt_v->GetString(), dt_v->GetStringLength()));
    if (tensor.datatype == DataType::kInvalid) {
      return Invalid(tensor.name, inferd::StrCat("unknown datatype '", std::string_view(dt_v->GetString(), dt_v->GetStringLength()), "'"));
    }
    if (shape_v == nullptr) return Invalid(tensor.name, "missing 'shape'");
    auto shape = ParseShape(*shape_v, tensor.name);
    if (!shape.ok()) return shape.status();
    tensor.shape = *std::move(shape);
    auto count = ElementCount(tensor.shape);
    if (!count.ok()) return Invalid(tensor.name, std::string(count.status().message()));

    std::optional<uint64_t> binary_size;
    if (in_params_v != nullptr) {
      const auto& p = *in_params_v;
      if (!p.IsObject()) return Invalid(tensor.name, "'parameters' must be an object");
      if (auto st = CheckScalarParameters(p); !st.ok()) return st;
      const auto [size_v, region_v, offset_v, byte_size_v] = FindMembers<4>(
          p, {"binary_data_size", "shared_memory_region", "shared_memory_offset",
              "shared_memory_byte_size"});
      if (size_v != nullptr) {
        if (!size_v->IsUint64()) return Invalid(tensor.name, "'binary_data_size' must be a non-negative integer");
        binary_size = size_v->GetUint64();
      }
      auto shm = ParseSharedMemoryParams(region_v, offset_v, byte_size_v, "input", tensor.name);
      if (!shm.ok()) return shm.status();
      tensor.shm = *std::move(shm);
    }
    if (tensor.shm) {
      if (data_v != nullptr || binary_size) {
        return Invalid(tensor.name, "must set only one of 'data', 'binary_data_size' and 'shared_memory_region'");
      }
      // The server points `data` into the region.
    } else if (binary_size) {
      if (data_v != nullptr) {
        return Invalid(tensor.name, "has both 'data' and 'binary_data_size'; send one");
      }
      if (*binary_size > binary.size() - binary_offset) {
        return Invalid(tensor.name, inferd::StrCat("binary_data_size is ", *binary_size,
                                                 " but only ", binary.size() - binary_offset,
                                                 " bytes of binary data remain in the body"));
      }
      tensor.data = binary.substr(binary_offset, *binary_size);
      binary_offset += *binary_size;
    } else {
      if (data_v == nullptr) {
        return Invalid(tensor.name, "has neither 'data' nor a 'binary_data_size' parameter");
      }
      std::string& buf = req.owned.emplace_back();
      const size_t elem = DataTypeSize(tensor.datatype);
      // Each JSON element takes at least one byte of the header, so a shape that claims more
      // elements than that cannot be satisfied: reserve nothing for it (a tiny request must
      // not make the server allocate gigabytes); the count check below rejects it.
      if (elem && static_cast<uint64_t>(*count) <= json.size()) {
        buf.reserve(static_cast<size_t>(*count) * elem);
      }
      int64_t got = 0;
      const size_t input_index = static_cast<size_t>(&in - inputs.Begin());
      absl::Status st;
      if (input_index < data_spans.size() && !data_spans[input_index].text.empty() &&
          tensor.datatype != DataType::kBytes) {
        // Straight from the text into the tensor (json_tensor.h).
        const JsonDataSpan& span = data_spans[input_index];
        size_t pos = static_cast<size_t>(span.text.data() - json.data());
        const size_t max_bytes = elem && static_cast<uint64_t>(*count) <= json.size()
                                     ? static_cast<size_t>(*count) * elem : 0;
        st = ParseJsonTensorData(json, &pos, tensor.datatype, tensor.shape, tensor.name,
                                 max_bytes, &buf, &got, span.flat ? pos + span.text.size() : 0);
      } else {
        if (input_index < data_spans.size() && !data_spans[input_index].text.empty()) {
          // BYTES (or anything the scanner left): the DOM of just this array.
          rapidjson::Document data_doc;
          absl::Status pst = ParseJsonExact(data_spans[input_index].text, data_doc);
          if (!pst.ok()) return pst;
          st = Flatten(data_doc, tensor.datatype, tensor.name, 0, &buf, &got);
        } else {
          st = Flatten(*data_v, tensor.datatype, tensor.name, 0, &buf, &got);
        }
      }
      if (!st.ok()) return st;
      if (got != *count) {
        return Invalid(tensor.name, inferd::StrCat("shape ", ShapeToString(tensor.shape), " needs ",
                                                 *count, " elements but 'data' has ", got));
      }
      tensor.data = buf;
    }
    req.inputs.push_back(std::move(tensor));
  }
  if (binary_offset != binary.size()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "the body has ", binary.size() - binary_offset,
        " bytes of binary data that no input claims (check binary_data_size and "
        "Inference-Header-Content-Length)"));
  }

  if (outputs_v != nullptr) {
    if (!outputs_v->IsArray()) return absl::InvalidArgumentError("'outputs' must be an array");
    req.outputs.reserve(outputs_v->Size());
    for (const auto& out : outputs_v->GetArray()) {
      if (!out.IsObject()) return absl::InvalidArgumentError("each entry of 'outputs' must be an object");
      const auto [name_v, out_params_v] = FindMembers<2>(out, {"name", "parameters"});
      if (name_v == nullptr || !name_v->IsString()) {
        return absl::InvalidArgumentError("a requested output has no 'name' string");
      }
      core::RequestedOutput ro;
      ro.name.assign(name_v->GetString(), name_v->GetStringLength());
      bool binary_flag = parsed.encoding.binary_default;
      if (out_params_v != nullptr) {
        const auto& p = *out_params_v;
        if (!p.IsObject()) {
          return absl::InvalidArgumentError(inferd::StrCat("output '", ro.name, "': 'parameters' must be an object"));
        }
        if (auto st = CheckScalarParameters(p); !st.ok()) return st;
        const auto [binary_v, class_v, region_v, offset_v, byte_size_v] = FindMembers<5>(
            p, {"binary_data", "classification", "shared_memory_region", "shared_memory_offset",
                "shared_memory_byte_size"});
        if (binary_v != nullptr) {
          if (!binary_v->IsBool()) {  // BoolParam's message, its context built only here
            return BoolParam(binary_v, "binary_data", inferd::StrCat("output '", ro.name, "'"))
                .status();
          }
          binary_flag = binary_v->GetBool();
        }
        if (class_v != nullptr) {
          if (!class_v->IsInt64() || class_v->GetInt64() < 0) {
            return absl::InvalidArgumentError(inferd::StrCat(
                "output '", ro.name, "': 'classification' must be a non-negative integer"));
          }
          ro.classification = class_v->GetInt64();
        }
        auto shm = ParseSharedMemoryParams(region_v, offset_v, byte_size_v, "output", ro.name);
        if (!shm.ok()) return shm.status();
        if (*shm && binary_v != nullptr && binary_flag) {
          return absl::InvalidArgumentError(inferd::StrCat(
              "output '", ro.name, "': can't set both 'shared_memory_region' and 'binary_data'"));
        }
        ro.shm = *std::move(shm);
      }
      ro.binary = binary_flag;
      parsed.encoding.per_output.emplace_back(ro.name, binary_flag);
      req.outputs.push_back(std::move(ro));
    }
  }
  return parsed;
}

absl::StatusOr<ParsedInfer> ParseRawInferRequest(std::string_view body, const RawInputSpec& spec,
                                                 std::shared_ptr<const void> owner) {
  const size_t elem = DataTypeSize(spec.datatype);
  if (elem == 0) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "a raw binary body needs a fixed-size datatype; input '", spec.name, "' is ",
        DataTypeName(spec.datatype)));
  }
  // At most one variable dimension, inferred from the body size; the batch size is inferred
  // when every dimension is fixed, and is 1 otherwise.
  int64_t per_item = 1;
  int variable = -1;
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    if (spec.dims[i] < 0) {
      if (variable >= 0) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "a raw binary body cannot fill input '", spec.name,
            "', which has more than one variable dimension; send a JSON header instead"));
      }
      variable = static_cast<int>(i);
    } else {
      per_item *= spec.dims[i];
    }
  }
  const size_t item_bytes = static_cast<size_t>(per_item) * elem;
  ParsedInfer parsed;
  parsed.request = std::make_unique<core::InferRequest>();
  core::InferRequest& req = *parsed.request;
  req.payload = std::move(owner);
  core::InputTensor t;
  t.name = spec.name;
  t.datatype = spec.datatype;
  if (item_bytes == 0 || body.size() % item_bytes != 0 || body.empty()) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "raw binary body of ", body.size(), " bytes is not a whole number of '", spec.name,
        "' elements of ", item_bytes, " bytes"));
  }
  const int64_t units = static_cast<int64_t>(body.size() / item_bytes);
  if (spec.batching) t.shape.push_back(variable >= 0 ? 1 : units);
  for (size_t i = 0; i < spec.dims.size(); ++i) {
    t.shape.push_back(static_cast<int>(i) == variable ? units : spec.dims[i]);
  }
  if (!spec.batching && variable < 0 && units != 1) {
    return absl::InvalidArgumentError(inferd::StrCat(
        "raw binary body of ", body.size(), " bytes does not match input '", spec.name, "' of ",
        item_bytes, " bytes"));
  }
  t.data = body;
  req.inputs.push_back(std::move(t));
  parsed.encoding.binary_default = true;
  return parsed;
}

namespace {

// The JSON header of a response whose outputs are all binary or in shared memory (the common
// case of tritonclient and perf_analyzer), written straight into the body: the same text as the
// rapidjson path below, at a fraction of its cost. False (nothing written) where an output
// goes back as JSON data.
bool SerializeBinaryOnly(core::InferResponse& response, const OutputEncoding& encoding,
                         HttpResponse* http) {
  if (!response.parameters.empty()) return false;  // the general writer has them
  for (const auto& out : response.outputs) {
    if (!out.in_shared_memory && !encoding.IsBinary(out.name)) return false;
  }
  std::string& b = http->body;
  b.reserve(96 + response.model_name.size() + response.id.size() + 112 * response.outputs.size());
  b.append("{\"model_name\":");
  AppendJsonString(&b, response.model_name);
  b.append(",\"model_version\":\"");
  inferd::StrAppend(&b, response.model_version);
  b.push_back('"');
  if (!response.id.empty()) {
    b.append(",\"id\":");
    AppendJsonString(&b, response.id);
  }
  b.append(",\"outputs\":[");
  bool any_binary = false;
  for (size_t i = 0; i < response.outputs.size(); ++i) {
    auto& out = response.outputs[i];
    if (i > 0) b.push_back(',');
    b.append("{\"name\":");
    AppendJsonString(&b, out.name);
    b.append(",\"datatype\":");
    AppendJsonString(&b, DataTypeName(out.datatype));
    b.append(",\"shape\":[");
    for (size_t d = 0; d < out.shape.size(); ++d) {
      if (d > 0) b.push_back(',');
      inferd::StrAppend(&b, out.shape[d]);
    }
    b.push_back(']');
    if (!out.in_shared_memory) {
      any_binary = true;
      b.append(",\"parameters\":{\"binary_data_size\":");
      inferd::StrAppend(&b, static_cast<uint64_t>(out.data.size()));
      b.push_back('}');
      http->tail.push_back(out.data);
      if (out.holder) http->holders.push_back(out.holder);
    }
    b.push_back('}');
  }
  b.append("]}");
  if (any_binary) {
    http->content_type = "application/octet-stream";
    http->headers.emplace_back("Inference-Header-Content-Length", inferd::StrCat(b.size()));
  } else {
    http->content_type = "application/json";
  }
  return true;
}

}  // namespace

HttpResponse SerializeInferResponse(core::InferResponse& response,
                                    const OutputEncoding& encoding) {
  HttpResponse http;
  if (SerializeBinaryOnly(response, encoding, &http)) return http;
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("model_name");
  w.String(response.model_name.c_str(), response.model_name.size());
  w.Key("model_version");
  std::string version = inferd::StrCat(response.model_version);
  w.String(version.c_str(), version.size());
  if (!response.id.empty()) {
    w.Key("id");
    w.String(response.id.c_str(), response.id.size());
  }
  if (!response.parameters.empty()) {
    w.Key("parameters");
    w.StartObject();
    for (const auto& p : response.parameters) {
      w.Key(p.name.c_str(), static_cast<rapidjson::SizeType>(p.name.size()));
      if (const bool* b = std::get_if<bool>(&p.value)) {
        w.Bool(*b);
      } else if (const int64_t* n = std::get_if<int64_t>(&p.value)) {
        w.Int64(*n);
      } else {
        const std::string& v = std::get<std::string>(p.value);
        w.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
      }
    }
    w.EndObject();
  }
  w.Key("outputs");
  w.StartArray();
  bool any_binary = false;
  for (auto& out : response.outputs) {
    w.StartObject();
    w.Key("name");
    w.String(out.name.c_str(), out.name.size());
    w.Key("datatype");
    std::string_view dt = DataTypeName(out.datatype);
    w.String(dt.data(), dt.size());
    w.Key("shape");
    w.StartArray();
    for (int64_t d : out.shape) w.Int64(d);
    w.EndArray();
    if (out.in_shared_memory) {
      // The data is in the client's region: only the description goes back (as Triton).
    } else if (encoding.IsBinary(out.name)) {
      any_binary = true;
      w.Key("parameters");
      w.StartObject();
      w.Key("binary_data_size");
      w.Uint64(out.data.size());
      w.EndObject();
      http.tail.push_back(out.data);
      if (out.holder) http.holders.push_back(out.holder);
    } else {
      w.Key("data");
      if (out.datatype == DataType::kBytes) {
        WriteOutputData(w, out);
      } else {
        // Numbers by std::to_chars in bulk (json_tensor.h), one memcpy into the body: the
        // writer puts out its separator for an empty raw value and the text follows it
        // (RawValue would copy it byte by byte).
        std::string text;
        AppendJsonTensorData(out.data, out.datatype, &text);
        w.RawValue("", 0, rapidjson::kArrayType);
        std::memcpy(buf.Push(text.size()), text.data(), text.size());
      }
    }
    w.EndObject();
  }
  w.EndArray();
  w.EndObject();
  http.body.assign(buf.GetString(), buf.GetSize());
  if (any_binary) {
    http.content_type = "application/octet-stream";
    http.headers.emplace_back("Inference-Header-Content-Length", inferd::StrCat(http.body.size()));
  } else {
    http.content_type = "application/json";
  }
  return http;
}

int HttpStatusFromStatus(const absl::Status& status) {
  if (!status.ok()) {
    if (std::optional<int> hint = HttpStatusHint(status)) return *hint;
  }
  switch (status.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kCancelled:
      return 400;
    case absl::StatusCode::kUnauthenticated: return 401;
    case absl::StatusCode::kPermissionDenied: return 403;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kAlreadyExists:
    case absl::StatusCode::kAborted:
      return 409;
    case absl::StatusCode::kUnimplemented: return 501;
    case absl::StatusCode::kUnavailable: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    case absl::StatusCode::kResourceExhausted: return 507;
    default: return 500;
  }
}

HttpResponse ErrorResponse(int http_status, std::string_view message) {
  HttpResponse http;
  http.status = http_status;
  http.content_type = "application/json";
  rapidjson::StringBuffer buf;
  JsonWriter w(buf);
  w.StartObject();
  w.Key("error");
  w.String(message.data(), message.size());
  w.EndObject();
  http.body.assign(buf.GetString(), buf.GetSize());
  return http;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  return ErrorResponse(HttpStatusFromStatus(status), std::string_view(status.message().data(), status.message().size()));
}

}  // namespace inferd::http
