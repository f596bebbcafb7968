// Fuzzes the KServe v2 infer request decoder (JSON, binary extension, raw body). The first
// two bytes choose the Inference-Header-Content-Length; the rest is the body.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "frontends/http/infer_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint16_t selector = static_cast<uint16_t>(data[0] | (data[1] << 8));
  std::string body(reinterpret_cast<const char*>(data + 2), size - 2);
  std::optional<size_t> header;
  if (selector & 0x8000) header = selector & 0x7fff;
  auto parsed = inferd::http::ParseInferRequest(body, header, nullptr);
  if (parsed.ok()) {
    // Serialize a response echoing the decoded inputs, as the identity backend would.
    inferd::core::InferResponse resp;
    resp.model_name = "m";
    for (const auto& in : parsed->request->inputs) {
      resp.outputs.push_back({in.name, in.datatype, in.shape, in.data, nullptr});
    }
    (void)inferd::http::SerializeInferResponse(resp, parsed->encoding);
  }
  auto raw = inferd::http::ParseRawInferRequest(
      body, {"x", inferd::DataType::kFp32, {-1}, (selector & 1) != 0}, nullptr);
  (void)raw;
  return 0;
}
