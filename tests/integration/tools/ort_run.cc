// Runs one model with ONNX Runtime called directly (no inferd code), for
// test_onnx_testdata.py to compare inferd's outputs with. Reads from stdin:
//   <model path>
//   <input count>
//   then per input: <name> <ONNX element type> <rank> <dims...> <file of raw little-endian bytes>
//   <output dir>
// and writes per output <output dir>/<index>.bin (raw bytes) and a line to stdout:
//   <name> <ONNX element type> <rank> <dims...>
// Numeric tensors only (no STRING). Exits 1 with ONNX Runtime's message on stderr on failure.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "onnxruntime_cxx_api.h"

int main() {
  try {
    std::string model, out_dir;
    size_t n = 0;
    std::cin >> model >> n;
    Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "ort_run");
    Ort::SessionOptions options;
    options.SetIntraOpNumThreads(1);
    Ort::Session session(env, model.c_str(), options);
    Ort::MemoryInfo cpu = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
    std::vector<std::string> names(n);
    std::vector<std::vector<char>> buffers(n);
    std::vector<Ort::Value> inputs;
    for (size_t i = 0; i < n; ++i) {
      int type = 0;
      size_t rank = 0;
      std::cin >> names[i] >> type >> rank;
      std::vector<int64_t> dims(rank);
      for (auto& d : dims) std::cin >> d;
      std::string file;
      std::cin >> file;
      std::ifstream f(file, std::ios::binary);
      buffers[i].assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      inputs.push_back(Ort::Value::CreateTensor(
          cpu, buffers[i].data(), buffers[i].size(), dims.data(), dims.size(),
          static_cast<ONNXTensorElementDataType>(type)));
    }
    std::cin >> out_dir;
    Ort::AllocatorWithDefaultOptions alloc;
    std::vector<std::string> out_names;
    for (size_t i = 0; i < session.GetOutputCount(); ++i) {
      out_names.push_back(session.GetOutputNameAllocated(i, alloc).get());
    }
    std::vector<const char*> in_ptrs, out_ptrs;
    for (auto& s : names) in_ptrs.push_back(s.c_str());
    for (auto& s : out_names) out_ptrs.push_back(s.c_str());
    auto outputs = session.Run(Ort::RunOptions{nullptr}, in_ptrs.data(), inputs.data(),
                               inputs.size(), out_ptrs.data(), out_ptrs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      auto info = outputs[i].GetTensorTypeAndShapeInfo();
      auto shape = info.GetShape();
      const size_t bytes = outputs[i].GetTensorSizeInBytes();
      std::ofstream f(out_dir + "/" + std::to_string(i) + ".bin", std::ios::binary);
      if (bytes > 0) f.write(static_cast<const char*>(outputs[i].GetTensorRawData()), bytes);
      std::cout << out_names[i] << " " << info.GetElementType() << " " << shape.size();
      for (int64_t d : shape) std::cout << " " << d;
      std::cout << "\n";
    }
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
  return 0;
}
