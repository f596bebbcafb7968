// JSON tensor `data` at binary-like speed: a tensor's numbers are parsed straight from the
// request text into the tensor buffer (no DOM, one pass; floating types by fast_float, exact),
// and written with std::to_chars into one buffer. A large flat array (512 KiB of text and up)
// is parsed in slices split at commas, and a large output written in slices, on the calling
// thread and helper threads started once (up to 4 in all, and no more than the CPUs): the
// conversions dominate a c=1 round trip there. Numbers shaped as floats are printed
// ("-d.ddd", up to 19 digits) are scanned a word at a time with no branch on their length.
// Strict JSON number grammar; NaN / Infinity / -Infinity accepted for floating types, as the
// DOM path accepts them. BYTES tensors take the DOM path (strings need unescaping).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "common/data_type.h"

namespace inferd::http {

// Parses the JSON value at json[*pos] (a number, true/false, or nested arrays of them) as
// `type` elements, appending them to `out` in row-major order; on success *pos is just past
// the value. `data` may be flat or nested in any way (deeper or shallower than `shape`, ragged):
// it is flattened and only its element count matters, which the caller checks against the shape
// (Triton 2.59.1's rule). A malformed value is INVALID_ARGUMENT naming `name`. *count: elements seen (also
// past the shape's count, so the caller can say how many came). Nothing is appended past
// `max_bytes` (the elements are still counted). `flat_end`, when the caller knows it (a scan
// already passed over the array): the array is flat and json[flat_end - 1] is its ']'.
absl::Status ParseJsonTensorData(std::string_view json, size_t* pos, DataType type,
                                 const Shape& shape, std::string_view name, size_t max_bytes,
                                 std::string* out, int64_t* count, size_t flat_end = 0);

// Appends `data` (`type` elements, not BYTES) as a flat JSON array.
void AppendJsonTensorData(std::string_view data, DataType type, std::string* out);

}  // namespace inferd::http
