// ONNX Runtime called in-process: the reference for inferd's ONNX latency. Runs a model with
// one FP32 input of the given shape, using the same session options inferd applies to the
// example resnet50 config (intra_op 2, inter_op 1, sequential, arena and pattern on, extended
// graph optimizations as `optimization { graph { level: 1 } }`, no spinning), and prints
// p50/p90/p99 latency in ms, items/s (first dimension = batch size) and the time to create the
// environment and session.
//   ort_inprocess <model.onnx> <input name> <iterations> <d0> <d1> ...
// SPIN=1 lets the pool threads spin (ONNX Runtime's own default; 0 otherwise).
// THREADS=n sets the intra-op thread count (2). SESSIONS=n runs n sessions at once, each in its
// own thread on its own copy of the input (as n inferd instances would); items/s is then the
// total over all sessions and the wall time, and the latencies are those of every run.
// CUDA_EP=<libonnxruntime_providers_cuda.so> runs the sessions on GPU 0 (CUDA_DEVICE=n) through
// ONNX Runtime's CUDA execution provider registered as a plugin, as inferd's GPU instances do
// (the input is host memory, copied to the device by each run, as in inferd): the in-process
// reference of tests/gpu/check.sh.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "onnxruntime_cxx_api.h"
#include "onnxruntime_session_options_config_keys.h"
#include "session_runs.h"

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s model.onnx input_name iterations dims...\n", argv[0]);
    return 2;
  }
  const int iterations = std::atoi(argv[3]);
  std::vector<int64_t> shape;
  for (int i = 4; i < argc; ++i) shape.push_back(std::atoll(argv[i]));
  size_t count = 1;
  for (auto d : shape) count *= d;
  // MISALIGN=n shifts the input by n bytes, as a tensor at an odd offset in a request body.
  const int misalign = std::getenv("MISALIGN") ? std::atoi(std::getenv("MISALIGN")) : 0;
  std::vector<char> storage(count * sizeof(float) + 64);
  float* data = reinterpret_cast<float*>(
      (reinterpret_cast<uintptr_t>(storage.data()) + 63) / 64 * 64 + misalign);
  std::vector<float> input(count);
  std::mt19937 rng(0);
  std::uniform_real_distribution<float> dist(0.f, 1.f);
  // ZEROS=1: all-zero input, as bench/binary_request.lua sends the server.
  const bool zeros = std::getenv("ZEROS") && std::string(std::getenv("ZEROS")) == "1";
  for (auto& v : input) v = zeros ? 0.f : dist(rng);

  const int threads = std::getenv("THREADS") ? std::atoi(std::getenv("THREADS")) : 2;
  const int sessions = std::getenv("SESSIONS") ? std::max(1, std::atoi(std::getenv("SESSIONS"))) : 1;
  const auto env_start = std::chrono::steady_clock::now();
  Ort::Env env(ORT_LOGGING_LEVEL_WARNING, "bench");
  Ort::SessionOptions options;
  options.SetIntraOpNumThreads(threads);
  options.SetInterOpNumThreads(1);
  options.SetExecutionMode(ORT_SEQUENTIAL);
  options.SetGraphOptimizationLevel(ORT_ENABLE_EXTENDED);
  // SPIN=1: ONNX Runtime's own default (its pool threads spin before they block).
  const char* spin = std::getenv("SPIN") && std::string(std::getenv("SPIN")) == "1" ? "1" : "0";
  options.AddConfigEntry(kOrtSessionOptionsConfigAllowIntraOpSpinning, spin);
  options.AddConfigEntry(kOrtSessionOptionsConfigAllowInterOpSpinning, spin);
  if (const char* ep = std::getenv("CUDA_EP"); ep != nullptr && *ep) {
    const int want = std::getenv("CUDA_DEVICE") ? std::atoi(std::getenv("CUDA_DEVICE")) : 0;
    env.RegisterExecutionProviderLibrary("CUDA", ep);
    std::vector<Ort::ConstEpDevice> gpus;
    for (const Ort::ConstEpDevice& d : env.GetEpDevices()) {
      if (std::strcmp(d.EpName(), "CUDAExecutionProvider") == 0 &&
          d.Device().Type() == OrtHardwareDeviceType_GPU) {
        gpus.push_back(d);
      }
    }
    if (want < 0 || want >= static_cast<int>(gpus.size())) {
      std::fprintf(stderr, "the CUDA execution provider lists %zu GPU(s), no GPU %d\n",
                   gpus.size(), want);
      return 1;
    }
    options.AppendExecutionProvider_V2(env, {gpus[want]},
                                       std::unordered_map<std::string, std::string>{});
    std::printf("execution_provider CUDA device %d\n", want);
  }
  std::vector<std::unique_ptr<Ort::Session>> all;
  for (int i = 0; i < sessions; ++i) all.push_back(std::make_unique<Ort::Session>(env, argv[1], options));
  const double session_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - env_start).count();
  Ort::AllocatorWithDefaultOptions alloc;
  std::string out_name = all[0]->GetOutputNameAllocated(0, alloc).get();
  const char* in_names[] = {argv[2]};
  const char* out_names[] = {out_name.c_str()};
  Ort::MemoryInfo mem = Ort::MemoryInfo::CreateCpu(OrtDeviceAllocator, OrtMemTypeCPU);
  std::memcpy(data, input.data(), count * sizeof(float));
  // Session 0 reads `data` (aligned or MISALIGN-shifted); the others their own copy.
  std::vector<std::vector<float>> copies(sessions);
  for (int s = 1; s < sessions; ++s) copies[s] = input;
  inferd::bench::RunSessions(sessions, iterations, shape[0], [&](int s) {
    float* in_data = s == 0 ? data : copies[s].data();
    Ort::Value in = Ort::Value::CreateTensor<float>(mem, in_data, input.size(), shape.data(),
                                                    shape.size());
    auto out = all[s]->Run(Ort::RunOptions{nullptr}, in_names, &in, 1, out_names, 1);
  });
  std::printf("session_ms %.3f\n", session_ms);
  return 0;
}
