// Says whether ONNX Runtime itself (the library inferd links, called directly, no inferd code)
// can create a session for each model file named on stdin, one path a line: it answers one
// line per file, "ok <path>" or "fail <path>: <ONNX Runtime's message>", each preceded by
// "try <path>" so the last such line names a model the runtime crashed on.
// test_onnx_testdata.py compiles it to skip the models the runtime cannot load, so what fails
// in inferd on the rest is inferd's. (Paths come on stdin: with some 700 paths as arguments
// the process died before main.)
#include <cstdio>
#include <iostream>
#include <string>

#include "onnxruntime_cxx_api.h"

int main() {
  Ort::Env env(ORT_LOGGING_LEVEL_ERROR, "ort_can_load");
  std::string path;
  while (std::getline(std::cin, path)) {
    if (path.empty()) continue;
    std::printf("try %s\n", path.c_str());
    std::fflush(stdout);
    try {
      Ort::SessionOptions options;
      options.SetIntraOpNumThreads(1);
      Ort::Session session(env, path.c_str(), options);
      std::printf("ok %s\n", path.c_str());
    } catch (const std::exception& e) {
      std::printf("fail %s: %s\n", path.c_str(), e.what());
    }
    std::fflush(stdout);
  }
  return 0;
}
