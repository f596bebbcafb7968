// The dynamic batcher's decision, as a pure function of the queue and the time, so it is
// tested deterministically with any clock: which requests form the next batch, or how long to
// wait for more. Triton's rules: if a preferred batch size can be formed, send the largest one
// possible; otherwise send the largest batch not over max_batch_size once it is full, once no
// more requests can join it, or once the oldest request has waited max_queue_delay.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace inferd::scheduling {

struct BatchPolicy {
  int64_t max_batch_size = 1;
  std::vector<int64_t> preferred_batch_sizes;  // any order
  uint64_t max_queue_delay_ns = 0;
};

// What the policy needs of one queued request, in scheduling order.
struct QueuedItem {
  uint64_t enqueue_ns = 0;
  int64_t batch_size = 1;
  // Requests batch together only when their non-batch shapes (and types) agree.
  const std::string* shape_key = nullptr;
};

struct BatchDecision {
  size_t take = 0;             // > 0: send the first `take` items now
  uint64_t wait_until_ns = 0;  // take == 0: decide again at this time (0: on the next arrival)
};

BatchDecision DecideBatch(const BatchPolicy& policy, std::span<const QueuedItem> queue,
                          uint64_t now_ns);

// Learned batch sizes (inferd's, not Triton's). A model does not run every batch size equally
// well per request: ResNet-50 on ONNX Runtime with two intra-op threads runs a batch of 3 about
// 13% slower per image than a batch of 4 (the threads split it unevenly), so a batcher that
// always sends everything queued loses throughput to the odd sizes the arrivals happen to form.
// BatchCosts keeps, for each batch size the model ran, a moving average of the run time per
// request; ShrinkBatch then sends a smaller batch when one has run clearly cheaper per
// request, and the rest waits for the next free instance (with the requests that arrive
// meanwhile). Only where the model's config names no preferred_batch_size: with one, Triton's
// rules apply exactly (preferred_batch_size: [ <max_batch_size> ] keeps Triton's "everything
// queued" with no learning).
//
// Thread-safe: Record runs on instance threads, Get on the batcher's; racy updates lose a
// sample at most.
class BatchCosts {
 public:
  // Sizes above kMaxLearned are not learned (sent as formed).
  static constexpr int64_t kMaxLearned = 4096;
  // A size's average counts once it has this many runs.
  static constexpr uint32_t kMinSamples = 8;
  // Batches whose runs take less are never split (for tiny models the split's extra run costs
  // more than any size's difference, and their timings are mostly the machine's noise).
  static constexpr uint64_t kMinRunNs = 1'000'000;

  explicit BatchCosts(int64_t max_batch_size);

  // One run of `batch_total` requests' worth of batch that took `run_ns` (the whole Execute:
  // gathering inputs, the run, scattering outputs).
  void Record(int64_t batch_total, uint64_t run_ns);

  struct Cost {
    uint64_t ns_per_item = 0;  // moving average, 1/8 weight to the newest run
    uint32_t samples = 0;      // runs seen (saturates)
  };
  Cost Get(int64_t batch_total) const;

 private:
  struct Slot {
    std::atomic<uint64_t> ns_per_item{0};
    std::atomic<uint32_t> samples{0};
  };
  const int64_t max_;
  std::unique_ptr<Slot[]> slots_;  // [0, max_]
};

// How many of the first `take` queue items (DecideBatch's choice) to send: a shorter prefix
// when its batch total has run at least 5% cheaper per request than the whole (both with
// kMinSamples runs or more, the whole's runs taking kMinRunNs or more; the cheapest such
// prefix), else `take`. Every eighth time it would
// shrink it sends the whole instead, so the whole's average keeps up with the model (a size
// that ran slowly once is not shunned forever). `shrinks` counts those decisions (the
// batcher's own, under its lock).
size_t ShrinkBatch(std::span<const QueuedItem> queue, size_t take, const BatchCosts& costs,
                   uint64_t* shrinks);

}  // namespace inferd::scheduling
