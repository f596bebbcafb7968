// torch::jit called in-process: the reference for inferd's PyTorch backend. Runs a TorchScript
// module with one FP32 input under InferenceMode with the given intra-op threads (as the
// backend does) and prints p50/p90/p99 latency in ms and items/s.
//   torch_inprocess <model.pt> <threads> <iterations> <d0> <d1> ...
// SESSIONS=n loads the module n times and runs the copies at once, each in its own thread (as
// n inferd instances without weight sharing would); items/s is then the total over wall time.
#include <torch/script.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
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
  const int sessions = std::getenv("SESSIONS") ? std::max(1, std::atoi(std::getenv("SESSIONS"))) : 1;
  std::vector<torch::jit::Module> modules;
  for (int i = 0; i < sessions; ++i) {
    modules.push_back(torch::jit::load(argv[1], torch::kCPU));
    modules.back().eval();
  }
  std::vector<std::vector<double>> per(sessions);
  std::vector<std::thread> runners;
  const auto wall0 = std::chrono::steady_clock::now();
  for (int s = 0; s < sessions; ++s) {
    runners.emplace_back([&, s] {
      for (int i = 0; i < iterations + 3; ++i) {
        auto t0 = std::chrono::steady_clock::now();
        {
          c10::InferenceMode guard;
          auto out = modules[s].forward({input}).toTensor();
        }
        auto t1 = std::chrono::steady_clock::now();
        if (i >= 3) per[s].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  for (auto& t : runners) t.join();
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - wall0).count();
  std::vector<double> ms;
  double total = 0;
  for (auto& v : per) {
    for (double m : v) total += m;
    ms.insert(ms.end(), v.begin(), v.end());
  }
  const double items_per_s = sessions == 1
      ? shape[0] * ms.size() * 1000.0 / total
      : shape[0] * double(sessions) * (iterations + 3) * 1000.0 / wall_ms;
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) { return ms[std::min(ms.size() - 1, size_t(p * ms.size()))]; };
  std::printf("p50_ms %.3f\np90_ms %.3f\np99_ms %.3f\nitems_per_s %.3f\n", pct(0.5), pct(0.9),
              pct(0.99), items_per_s);
  return 0;
}
