// The model store's memory budget (TF Serving's ResourceTracker): what the loaded models hold,
// what loads under way have reserved, what unloaded models still hold until they are freed,
// and, when a load does not fit, which idle models the eviction policy gives up for it.
//
// The accounting: resident = reserved + retiring + the sum of every model's settled bytes.
//   Reserve (TryReserve)  a load's estimate, before it starts, so loads running together
//                         cannot each fit alone and overshoot together;
//   Settle                the load's measured footprint replaces its reservation;
//   Retire                an unloaded or evicted model's bytes stay counted ("retiring") ...
//   Freed                 ... until its versions are freed and the memory is back.
// The budget owns the eviction policy and makes every call to it (loaded, unloaded, the
// requests counted since the last look, the choice of victims); the store evicts the victims
// it names, since only the store knows whether one is still idle when it comes to it.
//
// Thread-safe. Its mutex is a leaf: the store may call it under its own lock, and the budget
// never calls out while it holds its own (the policy is bookkeeping only). Lives as long as
// the store that owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/mutex.h"
#include "repository/eviction_policy.h"

namespace inferd::repository {

class MemoryBudget {
 public:
  // `budget_bytes` 0: no budget (TryReserve always fits). `wait_limit` is only named in the
  // message of a budget that stayed full (--model-load-wait-secs).
  MemoryBudget(int64_t budget_bytes, std::unique_ptr<EvictionPolicy> policy,
               absl::Duration wait_limit);

  int64_t budget_bytes() const { return budget_bytes_; }
  bool enabled() const { return budget_bytes_ > 0; }

  // What the store knows of its models when a load asks for room (taken under its lock).
  struct Models {
    std::set<std::string> evictable;  // may ever be evicted (loaded on demand or from a URL)
    std::set<std::string> idle;       // of those, evictable now (no request holds them)
    std::map<std::string, std::string> why;  // name -> "pinned", "ensemble part", "idle", "in use"
    std::vector<RequestCount> used;   // requests since the last look, least recently used first
  };
  // TryReserve's answer: it fits (and is reserved), or these victims would make room, or it
  // does not fit now (`status`: UNAVAILABLE, room may come) or ever (RESOURCE_EXHAUSTED).
  struct Room {
    bool fits = false;
    int64_t reserved = 0;              // held for the caller when it fits and it asked
    std::vector<std::string> victims;  // evict these (those still idle) and ask again
    bool forever = false;              // can never fit: `status` is final
    absl::Status status;               // set when neither fits nor victims
    uint64_t generation = 0;           // for WaitForChange
  };
  // Room for `needed` more bytes for `name`. An estimate larger than what is never evicted
  // leaves (pinned models, ensemble parts, `name`'s own versions) is cut to it, but never below
  // `at_least`, the load's sure minimum. With `reserve`, the room is held until Settle or
  // Release gives it back. `needed` 0 checks that what is settled fits (after a load).
  Room TryReserve(const std::string& name, int64_t needed, int64_t at_least, bool reserve,
                  const Models& models) ABSL_LOCKS_EXCLUDED(mu_);
  // Waits until the accounting changed since `generation` (a TryReserve's), or `timeout`.
  // True when it changed.
  bool WaitForChange(uint64_t generation, absl::Duration timeout) ABSL_LOCKS_EXCLUDED(mu_);

  // Gives back reserved bytes (a load that ended without settling them).
  void Release(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // `name`'s versions now hold `bytes` in all (after its load swapped them in); `release` of
  // the reservation is given back at the same moment.
  void Settle(const std::string& name, int64_t bytes, int64_t release) ABSL_LOCKS_EXCLUDED(mu_);
  // The policy's bookkeeping of a loaded model: `bytes` (its parts included) took `seconds`.
  void OnLoaded(const std::string& name, int64_t bytes, double seconds) ABSL_LOCKS_EXCLUDED(mu_);
  // `name`'s versions are out of service: `versions` (key, bytes) stay counted until Freed.
  // Its settled bytes end; the policy forgets it.
  void Retire(const std::string& name, const std::vector<std::pair<const void*, int64_t>>& versions)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The retired versions `keys` are freed: their memory is back.
  void Freed(const std::vector<const void*>& keys) ABSL_LOCKS_EXCLUDED(mu_);
  // Forgets every model's settled bytes (the store dropped them all at shutdown).
  void ClearSettled() ABSL_LOCKS_EXCLUDED(mu_);

  // --- GPU memory (--model-load-gpu-limit) ---
  // `name`'s versions now hold `bytes` of device memory per GPU id, in all (after its load
  // swapped them in). Replaced by each call; Retire and ClearSettled forget it.
  void SettleDevices(const std::string& name, std::map<int, int64_t> bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Device memory `name` holds on GPU `device` (0 when none).
  int64_t device_bytes(const std::string& name, int device) const ABSL_LOCKS_EXCLUDED(mu_);
  // The one idle model to evict so that a load of `name` fits under GPU `device`'s limit: the
  // eviction policy's first choice among the idle, evictable models holding memory on that
  // GPU (never `name`, never a model in use, never one holding memory only on other GPUs);
  // empty when there is none. One at a time: the caller measures the device again after each.
  std::string DeviceVictim(const std::string& name, int device, const Models& models)
      ABSL_LOCKS_EXCLUDED(mu_);
  // "a 512 MiB (pinned), b 128 MiB (in use)": the models holding memory on `device`, for the
  // refusal's message.
  std::string DeviceHolders(int device, const Models& models) const ABSL_LOCKS_EXCLUDED(mu_);

  // A backend's per-model overhead seen once: a footprint minus its size on disk.
  void NoteOverhead(int64_t bytes) ABSL_LOCKS_EXCLUDED(mu_);
  // The footprint a load will likely have: the model's own last footprint, else its size on
  // disk plus the largest overhead seen (only its size on disk with `from_disk`).
  int64_t Estimate(int64_t last_footprint, int64_t on_disk, bool from_disk) const
      ABSL_LOCKS_EXCLUDED(mu_);

  int64_t resident_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t reserved_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t settled_bytes(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  int64_t ResidentLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void ChangedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { ++generation_; }

  const int64_t budget_bytes_;
  const absl::Duration wait_limit_;
  mutable inferd::Mutex mu_;
  std::unique_ptr<EvictionPolicy> policy_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> settled_ ABSL_GUARDED_BY(mu_);
  // name -> GPU id -> device bytes its versions hold.
  std::map<std::string, std::map<int, int64_t>> device_settled_ ABSL_GUARDED_BY(mu_);
  int64_t settled_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<const void*, int64_t> retiring_ ABSL_GUARDED_BY(mu_);
  int64_t retiring_total_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t overhead_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace inferd::repository
