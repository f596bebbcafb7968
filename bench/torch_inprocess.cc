// torch::jit called in-process: the reference for inferd's PyTorch backend. Runs a TorchScript
// module with one FP32 input under InferenceMode with the given intra-op threads (as the
// backend does) and prints p50/p90/p99 latency in ms and items/s.
//   torch_inprocess <model.pt> <threads> <iterations> <d0> <d1> ...
// SESSIONS=n loads the module n times and runs the copies at once, each in its own thread (as
// n inferd instances without weight sharing would); items/s is then the total over wall time.
#include <torch/script.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "session_runs.h"

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
  const int sessions = std::getenv("SESSIONS") ? std::max(1, std::atoi(std::getenv("SESSIONS"))) : 1;
  std::vector<torch::jit::Module> modules;
  for (int i = 0; i < sessions; ++i) {
    modules.push_back(torch::jit::load(argv[1], torch::kCPU));
    modules.back().eval();
  }
  inferd::bench::RunSessions(sessions, iterations, shape[0], [&](int s) {
    c10::InferenceMode guard;
    auto out = modules[s].forward({input}).toTensor();
  });
  return 0;
}
