#include "scheduling/batch_policy.h"

#include <algorithm>

namespace inferd::scheduling {

BatchDecision DecideBatch(const BatchPolicy& policy, std::span<const QueuedItem> queue,
                          uint64_t now_ns) {
  BatchDecision d;
  if (queue.empty()) return d;
  // The longest prefix that fits in one batch.
  int64_t total = 0;
  size_t count = 0;
  size_t preferred_take = 0;
  bool blocked = false;  // a request waits behind this batch that cannot join it
  for (const QueuedItem& item : queue) {
    if (count > 0 && *item.shape_key != *queue[0].shape_key) {
      blocked = true;
      break;
    }
    if (total + item.batch_size > policy.max_batch_size) {
      blocked = true;
      break;
    }
    total += item.batch_size;
    ++count;
    if (std::find(policy.preferred_batch_sizes.begin(), policy.preferred_batch_sizes.end(),
                  total) != policy.preferred_batch_sizes.end()) {
      preferred_take = count;  // the largest preferred size reachable so far
    }
  }
  if (preferred_take > 0) {
    d.take = preferred_take;
    return d;
  }
  const uint64_t deadline = queue[0].enqueue_ns + policy.max_queue_delay_ns;
  if (total >= policy.max_batch_size || blocked || policy.max_queue_delay_ns == 0 ||
      now_ns >= deadline) {
    d.take = count;
    return d;
  }
  d.wait_until_ns = deadline;
  return d;
}

}  // namespace inferd::scheduling
