// torch::jit called in-process: the reference for inferd's PyTorch backend. Runs a TorchScript
// module with one FP32 input under InferenceMode with the given intra-op threads (as the
// backend does) and prints p50/p90/p99 latency in ms and items/s.
//   torch_inprocess <model.pt> <threads> <iterations> <d0> <d1> ...
#include <torch/script.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s model.pt threads iterations dims...\n", argv[0]);
    return 2;
  }
  at::set_num_threads(std::atoi(argv[2]));
  const int iterations = std::atoi(argv[3]);
  std::vector<int64_t> shape;
  for (int i = 4; i < argc; ++i) shape.push_back(std::atoll(argv[i]));
  torch::manual_seed(0);
  torch::Tensor input = torch::rand(shape);
  torch::jit::Module module = torch::jit::load(argv[1], torch::kCPU);
  module.eval();
  std::vector<double> ms;
  double total = 0;
  for (int i = 0; i < iterations + 3; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    {
      c10::InferenceMode guard;
      auto out = module.forward({input}).toTensor();
    }
    auto t1 = std::chrono::steady_clock::now();
    if (i >= 3) {
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      total += ms.back();
    }
  }
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) { return ms[std::min(ms.size() - 1, size_t(p * ms.size()))]; };
  std::printf("p50_ms %.3f\np90_ms %.3f\np99_ms %.3f\nitems_per_s %.3f\n", pct(0.5), pct(0.9),
              pct(0.99), shape[0] * ms.size() * 1000.0 / total);
  return 0;
}
