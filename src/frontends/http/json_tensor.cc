#include "frontends/http/json_tensor.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <vector>
#include <type_traits>

#include <fast_float/fast_float.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/strings.h"
#include "frontends/http/infer_codec.h"
#include "frontends/http/parallel_slices.h"

namespace inferd::http {
namespace {

constexpr int kMaxDepth = 64;

absl::Status Invalid(std::string_view input, std::string_view what) {
  return absl::InvalidArgumentError(inferd::StrCat("input '", input, "': ", what));
}

absl::Status Malformed(size_t offset, std::string_view what) {
  return absl::InvalidArgumentError(
      inferd::StrCat("malformed JSON in the request body at offset ", offset, ": ", what));
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

bool IsFloating(DataType t) {
  return t == DataType::kFp16 || t == DataType::kBf16 || t == DataType::kFp32 ||
         t == DataType::kFp64;
}

template <typename T>
absl::Status StoreInt(const char* s, const char* e, std::string_view name, char* dst) {
  T v;
  if (*s == '-') {
    int64_t x = 0;
    auto r = std::from_chars(s, e, x);
    if (r.ec != std::errc() || !std::is_signed_v<T> ||
        x < static_cast<int64_t>(std::numeric_limits<T>::min())) {
      return Invalid(name, inferd::StrCat("value ", std::string_view(s, e - s),
                                          " is out of range for its datatype"));
    }
    v = static_cast<T>(x);
  } else {
    uint64_t x = 0;
    auto r = std::from_chars(s, e, x);
    if (r.ec != std::errc() || x > static_cast<uint64_t>(std::numeric_limits<T>::max())) {
      return Invalid(name, inferd::StrCat("value ", std::string_view(s, e - s),
                                          " is out of range for its datatype"));
    }
    v = static_cast<T>(x);
  }
  if (dst) std::memcpy(dst, &v, sizeof(T));
  return absl::OkStatus();
}

void StoreFloating(double d, DataType type, char* dst) {
  if (!dst) return;
  switch (type) {
    case DataType::kFp64: std::memcpy(dst, &d, 8); break;
    case DataType::kFp32: {
      const float f = static_cast<float>(d);
      std::memcpy(dst, &f, 4);
      break;
    }
    case DataType::kFp16: {
      const uint16_t h = FloatToHalf(static_cast<float>(d));
      std::memcpy(dst, &h, 2);
      break;
    }
    default: {
      const uint16_t h = FloatToBf16(static_cast<float>(d));
      std::memcpy(dst, &h, 2);
      break;
    }
  }
}

// The value of eight digit bytes (0..9 each, the first, most significant, in the lowest byte):
// pairs, then fours, then the eight, by SWAR multiplies.
inline uint64_t CombineDigits(uint64_t x) {
  x = x * 10 + (x >> 8);
  return (((x & 0x000000FF000000FFULL) * (100 + (1000000ULL << 32))) +
          (((x >> 16) & 0x000000FF000000FFULL) * (1 + (10000ULL << 32)))) >> 32;
}

// Eight ASCII digits at p, or false. (SWAR: every byte in '0'..'9'.)
bool EightDigits(const char* p, uint64_t* v) {
  uint64_t x;
  std::memcpy(&x, p, 8);
  if ((((x + 0x4646464646464646ULL) | (x - 0x3030303030303030ULL)) & 0x8080808080808080ULL) != 0) {
    return false;
  }
  *v = CombineDigits(x - 0x3030303030303030ULL);
  return true;
}

constexpr double kExactPow10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,
                                  1e8,  1e9,  1e10, 1e11, 1e12, 1e13, 1e14, 1e15,
                                  1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// The common case of a JSON number, in one pass: the strict grammar checked while the digits
// accumulate, then the nearest double. A mantissa below 2^53 with a power of ten up to 22 is
// converted by one exact IEEE multiplication or division (Clinger's fast path, correctly rounded);
// other well-formed numbers go to fast_float over the span already validated. Null when p does
// not hold a well-formed number whose double is finite and non-zero-by-underflow: the caller's
// general path then gives the verdict and the error.
const char* FastJsonDouble(const char* p, const char* end, double* out) {
  const char* const start = p;
  const bool negative = p < end && *p == '-';
  p += negative;
  if (p == end || !IsDigit(*p)) return nullptr;
  uint64_t m = 0;
  int digits = 0;  // digits accumulated into m, leading zeros included (a bound, not exact)
  if (*p == '0') {
    ++p;
    if (p < end && IsDigit(*p)) return nullptr;  // "01"
  } else {
    while (p < end && IsDigit(*p)) {
      m = m * 10 + static_cast<uint64_t>(*p - '0');
      ++p;
      ++digits;
    }
  }
  int64_t exponent = 0;
  if (p < end && *p == '.') {
    ++p;
    const char* const frac = p;
    uint64_t eight;
    while (end - p >= 8 && EightDigits(p, &eight)) {
      m = m * 100000000ULL + eight;
      p += 8;
    }
    while (p < end && IsDigit(*p)) {
      m = m * 10 + static_cast<uint64_t>(*p - '0');
      ++p;
    }
    if (p == frac) return nullptr;  // "1."
    digits += static_cast<int>(p - frac);
    exponent = -(p - frac);
  }
  if (p < end && (*p == 'e' || *p == 'E')) {
    ++p;
    const bool negative_exp = p < end && *p == '-';
    if (p < end && (*p == '+' || *p == '-')) ++p;
    if (p == end || !IsDigit(*p)) return nullptr;  // "1e"
    int64_t e = 0;
    while (p < end && IsDigit(*p)) {
      if (e < 100000) e = e * 10 + (*p - '0');
      ++p;
    }
    exponent += negative_exp ? -e : e;
  }
  double d;
  if (digits <= 19) {  // m holds every digit
    if (m <= (uint64_t{1} << 53) && exponent >= -22 && exponent <= 22) {
      d = static_cast<double>(m);
      d = exponent < 0 ? d / kExactPow10[-exponent] : d * kExactPow10[exponent];
      *out = negative ? -d : d;
      return p;
    }
    // Eisel-Lemire on the digits already read (what fast_float::from_chars does after its own
    // scan); a negative power of two means it could not decide, and from_chars below does.
    const fast_float::adjusted_mantissa am =
        fast_float::compute_float<fast_float::binary_format<double>>(exponent, m);
    if (am.power2 >= 0) {
      fast_float::to_float(negative, am, d);
      if (std::isinf(d) || (d == 0 && m != 0)) return nullptr;
      *out = d;
      return p;
    }
  }
  const auto r = fast_float::from_chars(start, p, d);
  if (r.ptr != p || std::isinf(d) || (d == 0 && m != 0)) return nullptr;
  *out = d;
  return p;
}

// The value of the k (0..8) ASCII digits at q, read as one 8-byte word: the digits are moved to
// the top of the word, behind 8-k zero digits, and combined by CombineDigits.
inline uint64_t DigitsValue(const char* q, int k) {
  uint64_t x;
  std::memcpy(&x, q, 8);
  x -= 0x3030303030303030ULL;  // a borrow from a byte past the digits runs upward, out of reach
  const int shift = 8 * (8 - k);
  x = (x << (shift >> 1)) << (shift - (shift >> 1));  // k = 0 shifts by 64: zero, not UB
  return CombineDigits(x);
}

constexpr uint64_t kPow10U64[] = {1ULL,
                                  10ULL,
                                  100ULL,
                                  1000ULL,
                                  10000ULL,
                                  100000ULL,
                                  1000000ULL,
                                  10000000ULL,
                                  100000000ULL,
                                  1000000000ULL,
                                  10000000000ULL,
                                  100000000000ULL,
                                  1000000000000ULL,
                                  10000000000000ULL,
                                  100000000000000ULL,
                                  1000000000000000ULL,
                                  10000000000000000ULL,
                                  100000000000000000ULL,
                                  1000000000000000000ULL,
                                  10000000000000000000ULL};

#if defined(__SSE2__)
// 16 zero bytes, then 16 of 0xFF: 16 bytes from kTailMask + k keep the last k lanes.
alignas(16) constexpr unsigned char kTailMask[32] = {
    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,    0,
    0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

// The value of the k (0..16) ASCII digits that end at e, with SSE2: the 16 bytes before e are
// read, those before the digits zeroed, and the digits combined in pairs, fours and eights by
// multiply-adds (no loop, no branch). Reads e-16 .. e-1.
inline uint64_t TailDigitsValue(const char* e, int k) {
  __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(e - 16));
  x = _mm_sub_epi8(x, _mm_set1_epi8('0'));
  x = _mm_and_si128(x, _mm_loadu_si128(reinterpret_cast<const __m128i*>(kTailMask + k)));
  // 16-bit lanes: low byte (the earlier, more significant digit) * 10 + high byte
  const __m128i pairs = _mm_add_epi16(
      _mm_mullo_epi16(_mm_and_si128(x, _mm_set1_epi16(0x00FF)), _mm_set1_epi16(10)),
      _mm_srli_epi16(x, 8));
  const __m128i fours = _mm_madd_epi16(pairs, _mm_set1_epi32(0x00010064));  // [100, 1]
  const __m128i packed = _mm_packs_epi32(fours, fours);
  const __m128i eights = _mm_madd_epi16(packed, _mm_set1_epi32(0x00012710));  // [10000, 1]
  const uint64_t hi = static_cast<uint32_t>(_mm_cvtsi128_si32(eights));
  const uint64_t lo = static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_srli_si128(eights, 4)));
  return hi * 100000000ULL + lo;
}

// Bit j set when byte j of the 32 at q is an ASCII digit.
inline uint32_t DigitMask32(const char* q) {
  const __m128i zero = _mm_set1_epi8('0');
  const __m128i nine = _mm_set1_epi8(9);
  const __m128i lo = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)), zero);
  const __m128i hi = _mm_sub_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)), zero);
  const uint32_t mlo =
      static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(lo, nine), nine)));
  const uint32_t mhi =
      static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_max_epu8(hi, nine), nine)));
  return mlo | (mhi << 16);
}

// The number shape tensors are sent in, "-d.ddd" with at most 7 integer digits, no exponent and
// at most 19 significant digits, with no branch on its length: the digit runs come from one
// 32-byte mask and the fraction is converted by TailDigitsValue, so numbers of varying length
// cost no branch mispredictions (the loop over digits did, about one in two numbers). Reads 16
// bytes before p and 48 from it. Null when p holds anything else (every malformed number
// included): FastJsonDouble then takes it, with its usual verdict.
[[gnu::always_inline]] inline const char* WideJsonDouble(const char* p, double* out) {
  const bool negative = *p == '-';
  p += negative;
  const uint32_t mask = DigitMask32(p);
  const int i = std::countr_one(mask);
  if (i == 0 || i > 7 || p[i] != '.' || (*p == '0' && i > 1)) return nullptr;
  const int f = std::countr_one(mask >> (i + 1));  // the '.' is a zero bit: this stops inside
  if (f == 0 || i + f > 19) return nullptr;
  const char* const frac = p + i + 1;
  const char* const e = frac + f;
  const int head = f > 16 ? f - 16 : 0;  // fraction digits before the last 16
  const uint64_t int_value = i == 1 ? static_cast<uint64_t>(*p - '0') : DigitsValue(p, i);
  const uint64_t m = int_value * kPow10U64[f] + DigitsValue(frac, head) * kPow10U64[16] +
                     TailDigitsValue(e, f - head);
  p = e;
  if ((*p | 0x20) == 'e') return nullptr;
  const int exponent = f;
  // Eisel-Lemire for every number: Clinger's division is cheaper, but choosing between them
  // (mantissa above 2^53 or not, about one number in two) was a branch mispredicted as often.
  const fast_float::adjusted_mantissa am =
      fast_float::compute_float<fast_float::binary_format<double>>(-exponent, m);
  if (am.power2 < 0) return nullptr;
  double d;
  fast_float::to_float(false, am, d);
  *out = negative ? -d : d;
  return p;
}
#endif  // __SSE2__

// A JSON number (strict grammar) for a floating type at json[*pos], in one pass by fast_float
// (exact: Eisel-Lemire with a big-number fallback), then the few things fast_float accepts and
// JSON does not ("1.", "1.e5", a leading zero) turned away. False when json[*pos] does not start
// a number, for ParseScalar's general path; otherwise *st holds the outcome.
bool ParseFloatingNumber(std::string_view json, size_t* pos, DataType type, char* dst,
                         absl::Status* st) {
  const char* begin = json.data();
  const char* p = begin + *pos;
  const char* end = begin + json.size();
  const char* s = p + (*p == '-');
  if (s == end || !IsDigit(*s)) return false;
  {
    double d;
    if (const char* q = FastJsonDouble(p, end, &d)) {
      *pos = q - begin;
      StoreFloating(d, type, dst);
      return true;
    }
  }
  if (*s == '0' && s + 1 < end && IsDigit(s[1])) {
    // "01": JSON reads the 0 alone, and the caller finds no comma after it.
    *pos = s + 1 - begin;
    StoreFloating(*p == '-' ? -0.0 : 0.0, type, dst);
    return true;
  }
  double d = 0;
  const auto r = fast_float::from_chars(p, end, d);
  const char* q = r.ptr;
  for (const char* c = s + 1; c < q; ++c) {
    if (*c == '.') {
      if (c + 1 == q || !IsDigit(c[1])) {
        *st = Malformed(c + 1 - begin, "missing fraction part in number");
        return true;
      }
      break;
    }
    if (*c == 'e' || *c == 'E') break;
  }
  if (q < end && (*q == 'e' || *q == 'E')) {  // fast_float stops before an exponent with no digits
    ++q;
    if (q < end && (*q == '+' || *q == '-')) ++q;
    *st = Malformed(q - begin, "missing exponent in number");
    return true;
  }
  if (std::isinf(d) || d == 0) {
    // Past a double's range, either way: the same verdict as std::from_chars (ERANGE).
    double check = 0;
    const auto c = std::from_chars(p, q, check);
    if (c.ec != std::errc() || c.ptr != q) {
      *st = Malformed(p - begin, inferd::StrCat("number ", std::string_view(p, q - p),
                                                " does not fit in a double"));
      return true;
    }
  }
  *pos = q - begin;
  StoreFloating(d, type, dst);
  return true;
}

// One scalar at json[*pos]; writes it to dst (null: only validate). Advances *pos.
absl::Status ParseScalar(std::string_view json, size_t* pos, DataType type, std::string_view name,
                         char* dst) {
  if (IsFloating(type)) {
    absl::Status st;
    if (ParseFloatingNumber(json, pos, type, dst, &st)) return st;
  }
  const char* begin = json.data();
  const char* p = begin + *pos;
  const char* end = begin + json.size();
  auto literal = [&](std::string_view word) {
    return static_cast<size_t>(end - p) >= word.size() && std::memcmp(p, word.data(), word.size()) == 0;
  };
  if (*p == 't' || *p == 'f') {
    const bool value = *p == 't';
    if (!literal(value ? "true" : "false")) return Malformed(*pos, "invalid value");
    if (type != DataType::kBool) {
      return Invalid(name, IsFloating(type) ? "'data' holds a value that is not a number"
                                            : "'data' holds a value that is not an integer");
    }
    if (dst) *dst = value ? 1 : 0;
    *pos += value ? 4 : 5;
    return absl::OkStatus();
  }
  if (type == DataType::kBool) {
    if (*p == '-' || IsDigit(*p) || *p == 'N' || *p == 'I' || *p == 'n' || *p == '"' || *p == '{') {
      return Invalid(name, "BOOL 'data' must hold true or false");
    }
    return Malformed(*pos, "invalid value");
  }
  // NaN and the infinities, as the DOM path (rapidjson's kParseNanAndInfFlag) reads them.
  double special = 0;
  size_t special_len = 0;
  if (literal("NaN")) {
    special = std::numeric_limits<double>::quiet_NaN();
    special_len = 3;
  } else if (literal("Infinity")) {
    special = std::numeric_limits<double>::infinity();
    special_len = 8;
  } else if (literal("-Infinity")) {
    special = -std::numeric_limits<double>::infinity();
    special_len = 9;
  }
  if (special_len) {
    if (!IsFloating(type)) return Invalid(name, "'data' holds a value that is not an integer");
    StoreFloating(special, type, dst);
    *pos += special_len;
    return absl::OkStatus();
  }
  if (*p == 'n' || *p == '"' || *p == '{') {
    return Invalid(name, IsFloating(type) ? "'data' holds a value that is not a number"
                                          : "'data' holds a value that is not an integer");
  }
  // JSON's number grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  const char* q = p;
  if (q < end && *q == '-') ++q;
  if (q < end && *q == '0') {
    ++q;
  } else if (q < end && IsDigit(*q)) {
    while (q < end && IsDigit(*q)) ++q;
  } else {
    return Malformed(q - begin, "invalid value");
  }
  bool integral = true;
  if (q < end && *q == '.') {
    ++q;
    if (q == end || !IsDigit(*q)) return Malformed(q - begin, "missing fraction part in number");
    while (q < end && IsDigit(*q)) ++q;
    integral = false;
  }
  if (q < end && (*q == 'e' || *q == 'E')) {
    ++q;
    if (q < end && (*q == '+' || *q == '-')) ++q;
    if (q == end || !IsDigit(*q)) return Malformed(q - begin, "missing exponent in number");
    while (q < end && IsDigit(*q)) ++q;
    integral = false;
  }
  *pos = q - begin;
  if (integral) {
    switch (type) {
      case DataType::kUint8: return StoreInt<uint8_t>(p, q, name, dst);
      case DataType::kUint16: return StoreInt<uint16_t>(p, q, name, dst);
      case DataType::kUint32: return StoreInt<uint32_t>(p, q, name, dst);
      case DataType::kUint64: return StoreInt<uint64_t>(p, q, name, dst);
      case DataType::kInt8: return StoreInt<int8_t>(p, q, name, dst);
      case DataType::kInt16: return StoreInt<int16_t>(p, q, name, dst);
      case DataType::kInt32: return StoreInt<int32_t>(p, q, name, dst);
      case DataType::kInt64: return StoreInt<int64_t>(p, q, name, dst);
      default: break;
    }
  }
  double d = 0;
  auto r = std::from_chars(p, q, d);
  if (r.ec != std::errc() || r.ptr != q) {
    return Malformed(p - begin, inferd::StrCat("number ", std::string_view(p, q - p),
                                               " does not fit in a double"));
  }
  if (!IsFloating(type)) return Invalid(name, "'data' holds a value that is not an integer");
  StoreFloating(d, type, dst);
  return absl::OkStatus();
}

void SkipSpace(std::string_view json, size_t* pos) {
  while (*pos < json.size()) {
    const char c = json[*pos];
    if (c != ' ' && c != '\n' && c != '\r' && c != '\t') return;
    ++*pos;
  }
}

template <typename T>
char* WriteInt(char* p, char* end, const char* src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return std::to_chars(p, end, v).ptr;
}

template <typename T>
char* WriteFloat(char* p, char* end, T v) {
  if (std::isnan(v)) {
    std::memcpy(p, "NaN", 3);
    return p + 3;
  }
  if (std::isinf(v)) {
    if (v > 0) {
      std::memcpy(p, "Infinity", 8);
      return p + 8;
    }
    std::memcpy(p, "-Infinity", 9);
    return p + 9;
  }
  char* start = p;
  p = std::to_chars(p, end, v).ptr;
  // Keep a decimal point or exponent so clients read a float, as JSON writers do.
  for (char* c = start; c < p; ++c) {
    if (*c == '.' || *c == 'e') return p;
  }
  *p++ = '.';
  *p++ = '0';
  return p;
}

// 10^k as the nearest double, k from -32 to 56: the scales FP32 text needs (|x| from 1e-45 to
// 3.4e38, nine digits).
constexpr double kPow10Fp32[] = {1e-32, 1e-31, 1e-30, 1e-29, 1e-28, 1e-27, 1e-26, 1e-25, 1e-24, 1e-23, 1e-22, 1e-21, 1e-20, 1e-19, 1e-18, 1e-17, 1e-16, 1e-15, 1e-14, 1e-13, 1e-12, 1e-11, 1e-10, 1e-9, 1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22, 1e23, 1e24, 1e25, 1e26, 1e27, 1e28, 1e29, 1e30, 1e31, 1e32, 1e33, 1e34, 1e35, 1e36, 1e37, 1e38, 1e39, 1e40, 1e41, 1e42, 1e43, 1e44, 1e45, 1e46, 1e47, 1e48, 1e49, 1e50, 1e51, 1e52, 1e53, 1e54, 1e55, 1e56};
constexpr int kPow10Fp32Min = -32;

// FP32 as JSON text with nine significant digits, trailing zeros dropped. Nine digits identify
// every float (the decimal is within 5e-9 of it, relative, against a half-spacing of at least
// 3e-8), so a reader gets the same value back; the scaling by a power of ten in double arithmetic
// errs by a few 1e-16 and cannot move that. About 4x faster than std::to_chars' shortest form;
// the text is a digit longer on average. Fixed notation for 1e-5 <= |x| < 1e9, else d.ddde+XX.
char* WriteFp32(char* p, float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (bits >> 31) *p++ = '-';
  if ((bits & 0x7fffffffU) == 0) {
    std::memcpy(p, "0.0", 3);
    return p + 3;
  }
  const double a = std::fabs(static_cast<double>(x));
  const int field = static_cast<int>((bits >> 23) & 0xff);
  const int e2 = field ? field - 127 : std::ilogb(a);
  int e10 = (e2 * 78913) >> 18;  // floor(e2 * log10(2)): 10^e10 <= a < 10^(e10 + 2)
  auto scaled = [&](int e) {
    return static_cast<uint64_t>(a * kPow10Fp32[8 - e - kPow10Fp32Min] + 0.5);
  };
  uint64_t d = scaled(e10);
  if (d >= 1000000000) d = scaled(++e10);
  if (d >= 1000000000) {  // rounded up to 10^9
    d /= 10;
    ++e10;
  }
  char digits[9];
  for (int i = 8; i >= 0; --i) {
    digits[i] = static_cast<char>('0' + d % 10);
    d /= 10;
  }
  int n = 9;
  while (n > 1 && digits[n - 1] == '0') --n;
  if (e10 >= 0 && e10 < 9) {
    const int whole = e10 + 1;
    for (int i = 0; i < whole; ++i) *p++ = i < n ? digits[i] : '0';
    *p++ = '.';
    if (n > whole) {
      std::memcpy(p, digits + whole, n - whole);
      p += n - whole;
    } else {
      *p++ = '0';
    }
    return p;
  }
  if (e10 < 0 && e10 >= -5) {
    *p++ = '0';
    *p++ = '.';
    for (int i = -1; i > e10; --i) *p++ = '0';
    std::memcpy(p, digits, n);
    return p + n;
  }
  *p++ = digits[0];
  if (n > 1) {
    *p++ = '.';
    std::memcpy(p, digits + 1, n - 1);
    p += n - 1;
  }
  *p++ = 'e';
  *p++ = e10 < 0 ? '-' : '+';
  const int ae = e10 < 0 ? -e10 : e10;
  if (ae >= 10) *p++ = static_cast<char>('0' + ae / 10);
  else *p++ = '0';
  *p++ = static_cast<char>('0' + ae % 10);
  return p;
}

}  // namespace

namespace {

// Numbers separated by commas (and spaces) filling json[from, to) exactly, written to dst
// (room for `capacity`); *n counts them. False on anything else: the caller then parses the
// whole array serially, for the usual error.
bool IsJsonSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

// ParseFlatSlice for FP32 and FP64: one tight loop, each number converted by FastJsonDouble
// (bounded by the slice, which ends at a comma or the closing bracket) and stored as T.
template <typename T>
bool ParseFlatFloatSlice(const char* p, const char* to, const char* json_begin,
                         const char* json_end, char* dst, size_t capacity, size_t* n) {
  size_t i = *n;
#if defined(__SSE2__)
  // WideJsonDouble reads 16 bytes before a number and 48 from it.
  const char* const wide_from = json_begin + std::min<ptrdiff_t>(json_end - json_begin, 16);
  const char* const wide_to = json_end - std::min<ptrdiff_t>(json_end - json_begin, 48);
#endif
  for (;;) {
    while (p < to && IsJsonSpace(*p)) ++p;
    if (p >= to || i >= capacity) break;
    double d;
    const char* q = nullptr;
#if defined(__SSE2__)
    if (p >= wide_from && p < wide_to) q = WideJsonDouble(p, &d);
    if (q == nullptr || q > to) q = FastJsonDouble(p, to, &d);
#else
    q = FastJsonDouble(p, to, &d);
#endif
    if (q == nullptr) break;
    const T v = static_cast<T>(d);
    std::memcpy(dst + i * sizeof(T), &v, sizeof(T));
    ++i;
    p = q;
    while (p < to && IsJsonSpace(*p)) ++p;
    if (p == to) {
      *n = i;
      return true;
    }
    if (*p != ',') break;
    ++p;
  }
  *n = i;
  return false;
}

bool ParseFlatSlice(std::string_view json, size_t from, size_t to, DataType type,
                    std::string_view name, char* dst, size_t capacity, size_t* n) {
  if (type == DataType::kFp32) {
    return ParseFlatFloatSlice<float>(json.data() + from, json.data() + to, json.data(),
                                      json.data() + json.size(), dst, capacity, n);
  }
  if (type == DataType::kFp64) {
    return ParseFlatFloatSlice<double>(json.data() + from, json.data() + to, json.data(),
                                       json.data() + json.size(), dst, capacity, n);
  }
  const size_t elem = DataTypeSize(type);
  size_t pos = from;
  for (;;) {
    SkipSpace(json, &pos);
    if (pos >= to || *n >= capacity) return false;
    if (!ParseScalar(json, &pos, type, name, dst + *n * elem).ok()) return false;
    ++*n;
    SkipSpace(json, &pos);
    if (pos == to) return true;
    if (pos > to || json[pos] != ',') return false;
    ++pos;
  }
}

// A large flat array at json[*pos] ('['), parsed in slices split at commas, one per thread,
// into dst (room for `capacity` elements); flat_end as ParseJsonTensorData's. False (nothing
// consumed) when the array is small, nested, malformed or too long: the serial parser takes it.
bool ParseFlatParallel(std::string_view json, size_t* pos, DataType type, std::string_view name,
                       char* dst, size_t capacity, int64_t* count, size_t flat_end) {
  const char* b = json.data();
  const size_t open = *pos + 1;
  size_t close;
  if (flat_end > open && flat_end <= json.size() && b[flat_end - 1] == ']') {
    close = flat_end - 1;  // the caller's scan found it, and no nested array
  } else {
    const void* close_p = std::memchr(b + open, ']', json.size() - open);
    if (close_p == nullptr) return false;
    close = static_cast<const char*>(close_p) - b;
    if (close - open >= kParallelMinBytes && std::memchr(b + open, '[', close - open) != nullptr) {
      return false;
    }
  }
  const size_t len = close - open;
  const size_t threads = SlicesFor(len);
  if (len < kParallelMinBytes || threads < 2) {
    // Small, or one CPU: one slice on this thread, when the caller's scan vouched for flatness.
    if (close + 1 != flat_end) return false;
    size_t n = 0;
    if (!ParseFlatSlice(json, open, close, type, name, dst, capacity, &n)) return false;
    *count = static_cast<int64_t>(n);
    *pos = close + 1;
    return true;
  }
  std::vector<size_t> starts{open};
  for (size_t i = 1; i < threads; ++i) {
    const size_t target = open + len * i / threads;
    if (target <= starts.back()) continue;
    const void* comma = std::memchr(b + target, ',', close - target);
    if (comma == nullptr) break;
    starts.push_back(static_cast<const char*>(comma) - b + 1);
  }
  const size_t slices = starts.size();
  const size_t elem = DataTypeSize(type);
  // Slice 0 goes straight into dst; the others into buffers of their own (a number and its
  // comma take at least two bytes), copied after it.
  std::vector<std::unique_ptr<char[]>> bufs(slices);
  std::vector<size_t> caps(slices, capacity), counts(slices, 0);
  std::vector<char> ok(slices, 0);
  for (size_t i = 1; i < slices; ++i) {
    const size_t end = i + 1 < slices ? starts[i + 1] - 1 : close;
    caps[i] = std::min(capacity, (end - starts[i]) / 2 + 1);
    bufs[i].reset(new char[caps[i] * elem]);
  }
  RunSlices(slices, [&](size_t i) {
    const size_t end = i + 1 < slices ? starts[i + 1] - 1 : close;
    ok[i] = ParseFlatSlice(json, starts[i], end, type, name, i == 0 ? dst : bufs[i].get(), caps[i],
                           &counts[i]);
  });
  size_t total = 0;
  for (size_t i = 0; i < slices; ++i) {
    if (!ok[i]) return false;
    total += counts[i];
  }
  if (total > capacity) return false;
  size_t at = counts[0];
  for (size_t i = 1; i < slices; ++i) {
    std::memcpy(dst + at * elem, bufs[i].get(), counts[i] * elem);
    at += counts[i];
  }
  *count = static_cast<int64_t>(total);
  *pos = close + 1;
  return true;
}

}  // namespace

absl::Status ParseJsonTensorData(std::string_view json, size_t* pos, DataType type,
                                 const Shape& shape, std::string_view name, size_t max_bytes,
                                 std::string* out, int64_t* count, size_t flat_end) {
  const size_t elem = DataTypeSize(type);
  if (elem == 0) return Invalid(name, "unsupported datatype");
  const size_t base = out->size();
  out->resize(base + max_bytes);
  char* dst = out->data() + base;
  const size_t capacity = max_bytes / elem;
  *count = 0;
  auto next_dst = [&]() -> char* {
    return static_cast<size_t>(*count) < capacity ? dst + static_cast<size_t>(*count) * elem
                                                  : nullptr;
  };
  auto finish = [&](absl::Status st) {
    out->resize(base + std::min(static_cast<size_t>(*count), capacity) * elem);
    return st;
  };

  SkipSpace(json, pos);
  if (*pos >= json.size()) return finish(Malformed(*pos, "the document ends inside a value"));
  if (json[*pos] != '[') {  // a bare scalar counts as one element
    absl::Status st = ParseScalar(json, pos, type, name, next_dst());
    if (st.ok()) ++*count;
    return finish(st);
  }
  if (ParseFlatParallel(json, pos, type, name, dst, capacity, count, flat_end)) {
    return finish(absl::OkStatus());
  }
  // Any nesting (deeper or shallower than the shape, ragged rows, empty arrays) is walked
  // in row-major order and only the element count is checked, by the caller, as Triton 2.59.1
  // does: the SageMaker notebooks send a 3-deep image list for a 4-dimension shape.
  int depth = 0;
  for (;;) {
    // At a value: an array opens, or a scalar.
    SkipSpace(json, pos);
    if (*pos >= json.size()) return finish(Malformed(*pos, "the document ends inside 'data'"));
    bool closed_now = false;
    if (json[*pos] == '[') {
      ++depth;
      if (depth > kMaxDepth) return finish(Invalid(name, "'data' is nested too deeply"));
      ++*pos;
      SkipSpace(json, pos);
      if (*pos < json.size() && json[*pos] == ']') {
        ++*pos;
        closed_now = true;  // an empty array
      } else {
        continue;
      }
    } else {
      absl::Status st = ParseScalar(json, pos, type, name, next_dst());
      if (!st.ok()) return finish(st);
      ++*count;
    }
    // After a value: ',' continues the array, ']' closes it (and maybe its parents).
    for (;;) {
      if (closed_now) {
        closed_now = false;
        --depth;
        if (depth == 0) return finish(absl::OkStatus());
      }
      SkipSpace(json, pos);
      if (*pos >= json.size()) return finish(Malformed(*pos, "the document ends inside 'data'"));
      const char c = json[*pos];
      ++*pos;
      if (c == ',') break;
      if (c == ']') {
        closed_now = true;
        continue;
      }
      return finish(Malformed(*pos - 1, "missing a comma or ']' after an array element"));
    }
  }
}

namespace {

// Appends n `type` elements from src, comma-separated (a leading comma when `comma`).
void AppendElements(const char* src, size_t n, DataType type, bool comma, std::string* out) {
  const size_t size = DataTypeSize(type);
  // Formatted in chunks on the stack, appended in bulk: no per-number allocation.
  char chunk[16384];
  char* p = chunk;
  char* const limit = chunk + sizeof(chunk) - 64;
  for (size_t i = 0; i < n; ++i, src += size) {
    if (i || comma) *p++ = ',';
    char* const end = chunk + sizeof(chunk);
    switch (type) {
      case DataType::kBool:
        if (*src) {
          std::memcpy(p, "true", 4);
          p += 4;
        } else {
          std::memcpy(p, "false", 5);
          p += 5;
        }
        break;
      case DataType::kUint8: p = WriteInt<uint8_t>(p, end, src); break;
      case DataType::kUint16: p = WriteInt<uint16_t>(p, end, src); break;
      case DataType::kUint32: p = WriteInt<uint32_t>(p, end, src); break;
      case DataType::kUint64: p = WriteInt<uint64_t>(p, end, src); break;
      case DataType::kInt8: p = WriteInt<int8_t>(p, end, src); break;
      case DataType::kInt16: p = WriteInt<int16_t>(p, end, src); break;
      case DataType::kInt32: p = WriteInt<int32_t>(p, end, src); break;
      case DataType::kInt64: p = WriteInt<int64_t>(p, end, src); break;
      case DataType::kFp32: {
        float x;
        std::memcpy(&x, src, 4);
        p = std::isfinite(x) ? WriteFp32(p, x) : WriteFloat(p, end, x);
        break;
      }
      case DataType::kFp64: {
        double x;
        std::memcpy(&x, src, 8);
        p = WriteFloat(p, end, x);
        break;
      }
      case DataType::kFp16: {
        uint16_t x;
        std::memcpy(&x, src, 2);
        p = WriteFloat(p, end, HalfToFloat(x));
        break;
      }
      case DataType::kBf16: {
        uint16_t x;
        std::memcpy(&x, src, 2);
        p = WriteFloat(p, end, Bf16ToFloat(x));
        break;
      }
      default: break;
    }
    if (p >= limit) {
      out->append(chunk, p - chunk);
      p = chunk;
    }
  }
  out->append(chunk, p - chunk);
}

}  // namespace

void AppendJsonTensorData(std::string_view data, DataType type, std::string* out) {
  const size_t size = DataTypeSize(type);
  const size_t n = size ? data.size() / size : 0;
  out->push_back('[');
  // A large tensor is formatted in slices by several threads, then appended in order (an FP32
  // element takes ~11 bytes of text: the text is reckoned as 4x the data).
  const size_t slices = n ? std::min(n, SlicesFor(data.size() * 4)) : 0;
  if (slices >= 2) {
    std::vector<std::string> parts(slices);
    RunSlices(slices, [&](size_t i) {
      const size_t from = n * i / slices, to = n * (i + 1) / slices;
      parts[i].reserve((to - from) * 12);
      AppendElements(data.data() + from * size, to - from, type, i > 0, &parts[i]);
    });
    size_t total = 0;
    for (const auto& part : parts) total += part.size();
    out->reserve(out->size() + total + 1);
    for (const auto& part : parts) out->append(part);
  } else {
    AppendElements(data.data(), n, type, false, out);
  }
  out->push_back(']');
}

}  // namespace inferd::http
