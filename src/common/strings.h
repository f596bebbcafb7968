// String helpers that take std::string_view. Debian's Abseil is built with its own
// absl::string_view (not std::string_view), so absl::StrCat and friends do not accept the
// std::string_view values this code base passes around; these do, and absl::string_view too.
#pragma once

#include <charconv>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/string_view.h"

namespace inferd {
namespace strings_internal {

inline void Append(std::string* out, std::string_view s) { out->append(s.data(), s.size()); }
inline void Append(std::string* out, const char* s) { out->append(s); }
inline void Append(std::string* out, const std::string& s) { out->append(s); }
inline void Append(std::string* out, absl::string_view s) { out->append(s.data(), s.size()); }
inline void Append(std::string* out, char c) { out->push_back(c); }

template <typename T>
  requires std::is_arithmetic_v<T>
void Append(std::string* out, T v) {
  if constexpr (std::is_same_v<T, bool>) {
    out->push_back(v ? '1' : '0');
  } else {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    out->append(buf, end);
  }
}

}  // namespace strings_internal

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (strings_internal::Append(&out, args), ...);
  return out;
}

template <typename... Args>
void StrAppend(std::string* out, const Args&... args) {
  (strings_internal::Append(out, args), ...);
}

template <typename Range>
std::string StrJoin(const Range& range, std::string_view sep) {
  std::string out;
  bool first = true;
  for (const auto& item : range) {
    if (!first) out.append(sep);
    first = false;
    strings_internal::Append(&out, item);
  }
  return out;
}

inline char AsciiLower(char c) { return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c; }

inline bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  // Header names mostly arrive as written in the RFCs ("Content-Length"): one memcmp then.
  if (a == b) return true;
  for (size_t i = 0; i < a.size(); ++i) {
    if (AsciiLower(a[i]) != AsciiLower(b[i])) return false;
  }
  return true;
}

inline bool ContainsIgnoreCase(std::string_view haystack, std::string_view needle) {
  if (needle.size() > haystack.size()) return false;
  for (size_t i = 0; i + needle.size() <= haystack.size(); ++i) {
    if (EqualsIgnoreCase(haystack.substr(i, needle.size()), needle)) return true;
  }
  return false;
}

// Appends `s` as a JSON string: '"', '\\' and the control bytes escaped as rapidjson's Writer
// does (\b \f \n \r \t, else \u00XX with upper-case hex), every other byte as it is.
void AppendJsonString(std::string* out, std::string_view s);

}  // namespace inferd
