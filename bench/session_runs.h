// Timing loop shared by the in-process references (ort_inprocess, torch_inprocess): runs a
// model `sessions` times at once, each in its own thread, and reports latency percentiles and
// throughput the same way for every runtime.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>

namespace inferd::bench {

// Calls run_once(session) iterations + 3 times in each of `sessions` threads (the first three
// are warm-up and not timed) and prints p50/p90/p99 in ms and items/s, `batch` items per call.
// One session: items over the time spent in run_once. Several: items over wall time, which
// includes the warm-up calls, so it slightly understates.
template <typename RunOnce>
void RunSessions(int sessions, int iterations, int64_t batch, RunOnce run_once) {
  using Clock = std::chrono::steady_clock;
  std::vector<std::vector<double>> per(sessions);
  std::vector<std::thread> runners;
  const auto wall0 = Clock::now();
  for (int s = 0; s < sessions; ++s) {
    runners.emplace_back([&, s] {
      for (int i = 0; i < iterations + 3; ++i) {
        const auto t0 = Clock::now();
        run_once(s);
        const auto t1 = Clock::now();
        if (i >= 3) per[s].push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  for (auto& t : runners) t.join();
  const double wall_ms = std::chrono::duration<double, std::milli>(Clock::now() - wall0).count();
  std::vector<double> ms;
  double total_ms = 0;
  for (const auto& v : per) {
    for (double m : v) total_ms += m;
    ms.insert(ms.end(), v.begin(), v.end());
  }
  const double items_per_s = sessions == 1
      ? batch * ms.size() * 1000.0 / total_ms
      : batch * double(sessions) * (iterations + 3) * 1000.0 / wall_ms;
  std::sort(ms.begin(), ms.end());
  auto pct = [&](double p) { return ms[std::min(ms.size() - 1, size_t(p * ms.size()))]; };
  std::printf("p50_ms %.3f\np90_ms %.3f\np99_ms %.3f\nitems_per_s %.3f\n", pct(0.5), pct(0.9),
              pct(0.99), items_per_s);
}

}  // namespace inferd::bench
