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

BatchCosts::BatchCosts(int64_t max_batch_size)
    : max_(std::clamp<int64_t>(max_batch_size, 1, kMaxLearned)),
      slots_(std::make_unique<Slot[]>(static_cast<size_t>(max_) + 1)) {}

void BatchCosts::Record(int64_t batch_total, uint64_t run_ns) {
  if (batch_total < 1 || batch_total > max_) return;
  Slot& slot = slots_[static_cast<size_t>(batch_total)];
  const uint64_t per_item = run_ns / static_cast<uint64_t>(batch_total);
  const uint32_t seen = slot.samples.load(std::memory_order_relaxed);
  const uint64_t old = slot.ns_per_item.load(std::memory_order_relaxed);
  // The first run sets the average; later ones move it by 1/8, each clipped to [1/4, 2] times
  // the average so that one preempted run does not make a size look slow for long.
  const uint64_t sample = seen == 0 ? per_item : std::clamp(per_item, old / 4, old * 2);
  const uint64_t next = seen == 0 ? per_item : old - old / 8 + sample / 8;
  slot.ns_per_item.store(next, std::memory_order_relaxed);
  if (seen < UINT32_MAX) slot.samples.store(seen + 1, std::memory_order_relaxed);
}

BatchCosts::Cost BatchCosts::Get(int64_t batch_total) const {
  if (batch_total < 1 || batch_total > max_) return {};
  const Slot& slot = slots_[static_cast<size_t>(batch_total)];
  return {slot.ns_per_item.load(std::memory_order_relaxed),
          slot.samples.load(std::memory_order_relaxed)};
}

size_t ShrinkBatch(std::span<const QueuedItem> queue, size_t take, const BatchCosts& costs,
                   uint64_t* shrinks) {
  if (take < 2 || take > queue.size()) return take;
  int64_t whole = 0;
  for (size_t i = 0; i < take; ++i) whole += queue[i].batch_size;
  const BatchCosts::Cost all = costs.Get(whole);
  if (all.samples < BatchCosts::kMinSamples) return take;  // the whole is not known yet: run it
  // Short runs are the scheduler's and the clock's noise more than the model's: not split.
  if (all.ns_per_item * static_cast<uint64_t>(whole) < BatchCosts::kMinRunNs) return take;
  // A prefix must beat the whole by 5% per request: noise between sizes that run alike does
  // not split batches.
  uint64_t best = all.ns_per_item - all.ns_per_item / 20;
  size_t chosen = take;
  int64_t total = 0;
  for (size_t i = 0; i + 1 < take; ++i) {
    total += queue[i].batch_size;
    const BatchCosts::Cost c = costs.Get(total);
    if (c.samples >= BatchCosts::kMinSamples && c.ns_per_item < best) {
      best = c.ns_per_item;
      chosen = i + 1;
    }
  }
  if (chosen == take) return take;
  if (++*shrinks % 8 == 0) return take;  // now and then the whole, to keep its average fresh
  return chosen;
}

}  // namespace inferd::scheduling
