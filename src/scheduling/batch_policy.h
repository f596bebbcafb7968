// The dynamic batcher's decision, as a pure function of the queue and the time, so it is
// tested deterministically with any clock: which requests form the next batch, or how long to
// wait for more. Triton's rules: if a preferred batch size can be formed, send the largest one
// possible; otherwise send the largest batch not over max_batch_size once it is full, once no
// more requests can join it, or once the oldest request has waited max_queue_delay.
#pragma once

#include <cstdint>
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

}  // namespace inferd::scheduling
