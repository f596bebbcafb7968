#include "repository/memory_budget.h"

#include <algorithm>
#include <iterator>

#include "common/strings.h"

namespace inferd::repository {

MemoryBudget::MemoryBudget(int64_t budget_bytes, std::unique_ptr<EvictionPolicy> policy,
                           absl::Duration wait_limit)
    : budget_bytes_(budget_bytes), wait_limit_(wait_limit), policy_(std::move(policy)) {}

int64_t MemoryBudget::ResidentLocked() const {
  return reserved_ + retiring_total_ + settled_total_;
}

MemoryBudget::Room MemoryBudget::TryReserve(const std::string& name, int64_t needed,
                                            int64_t at_least, bool reserve, const Models& models) {
  const int64_t budget = budget_bytes_;
  Room room;
  inferd::MutexLock lock(&mu_);
  room.generation = generation_;
  if (budget <= 0) {
    room.fits = true;
    return room;
  }
  // The policy sees how each model has been used since it last looked (the store counted the
  // requests and took the counts for this call), whether or not this load fits.
  if (!models.used.empty()) policy_->OnUsedBatch(models.used);
  // What is never evicted (pinned models, ensemble parts, this model's own versions): an
  // estimate larger than the rest of the budget is cut to it (the load then shows what it
  // really needs), and a model whose sure minimum does not fit is refused at once.
  int64_t fixed = 0;
  for (const auto& [n, bytes] : settled_) {
    if (models.evictable.count(n) && n != name) continue;
    fixed += bytes;
  }
  if (needed > budget - fixed) needed = std::max<int64_t>(at_least, budget - fixed);
  const int64_t resident = ResidentLocked();
  if (resident + needed <= budget) {
    if (reserve) {
      reserved_ += needed;
      room.reserved = needed;
      ChangedLocked();
    }
    room.fits = true;
    return room;
  }
  auto idle = [&models, &name](const std::string& n) { return n != name && models.idle.count(n); };
  auto chosen = policy_->ChooseVictims(needed, resident, budget, idle);
  if (chosen.ok() && !chosen->empty()) {
    room.victims = *std::move(chosen);
    return room;
  }
  std::vector<std::string> held;
  for (const auto& [n, bytes] : settled_) {
    if (bytes <= 0) continue;
    auto why = models.why.find(n);
    held.push_back(StrCat(n, " ", bytes, " (", why == models.why.end() ? "in use" : why->second, ")"));
  }
  int64_t wants = needed;
  if (wants == 0) {  // the check after a load: the model's measured footprint
    if (auto it = settled_.find(name); it != settled_.end()) wants += it->second;
  }
  // Room comes back when requests in flight end (their models become evictable) and other
  // loads settle their reservations: the caller may wait for it (WaitForChange).
  room.forever = fixed + at_least > budget;
  if (!room.forever) {
    room.status = absl::UnavailableError(StrCat(
        "model '", name, "' needs about ", wants, " bytes and the memory budget ",
        "(--model-memory-budget) of ", budget, " bytes stayed full for ",
        absl::FormatDuration(wait_limit_), " (--model-load-wait-secs): ", StrJoin(held, ", "),
        "; retry later"));
  } else {
    room.status = absl::ResourceExhaustedError(StrCat(
        "model '", name, "' needs about ", wants, " bytes but the memory budget (",
        "--model-memory-budget) is ", budget, " bytes and ", resident,
        " are resident or reserved, none of it evictable: ",
        held.empty() ? std::string("no model is loaded") : StrJoin(held, ", ")));
  }
  return room;
}

bool MemoryBudget::WaitForChange(uint64_t generation, absl::Duration timeout) {
  inferd::MutexLock lock(&mu_);
  auto changed = [this, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return generation_ != generation;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&changed), timeout);
}

void MemoryBudget::Release(int64_t bytes) {
  inferd::MutexLock lock(&mu_);
  reserved_ -= bytes;
  ChangedLocked();
}

void MemoryBudget::Settle(const std::string& name, int64_t bytes, int64_t release) {
  inferd::MutexLock lock(&mu_);
  reserved_ -= release;
  int64_t& settled = settled_[name];
  settled_total_ += bytes - settled;
  settled = bytes;
  if (bytes == 0) settled_.erase(name);
  ChangedLocked();
}

void MemoryBudget::OnLoaded(const std::string& name, int64_t bytes, double seconds) {
  inferd::MutexLock lock(&mu_);
  policy_->OnLoaded(name, bytes, seconds);
}

void MemoryBudget::Retire(const std::string& name,
                          const std::vector<std::pair<const void*, int64_t>>& versions) {
  inferd::MutexLock lock(&mu_);
  if (auto it = settled_.find(name); it != settled_.end()) {
    settled_total_ -= it->second;
    settled_.erase(it);
  }
  for (const auto& [key, bytes] : versions) {
    if (bytes <= 0) continue;
    retiring_[key] += bytes;
    retiring_total_ += bytes;
  }
  device_settled_.erase(name);
  policy_->OnUnloaded(name);
  ChangedLocked();
}

void MemoryBudget::Freed(const std::vector<const void*>& keys) {
  inferd::MutexLock lock(&mu_);
  for (const void* key : keys) {
    if (auto it = retiring_.find(key); it != retiring_.end()) {
      retiring_total_ -= it->second;
      retiring_.erase(it);
    }
  }
  ChangedLocked();
}

void MemoryBudget::ClearSettled() {
  inferd::MutexLock lock(&mu_);
  settled_.clear();
  settled_total_ = 0;
  device_settled_.clear();
  ChangedLocked();
}

void MemoryBudget::SettleDevices(const std::string& name, std::map<int, int64_t> bytes) {
  inferd::MutexLock lock(&mu_);
  for (auto it = bytes.begin(); it != bytes.end();) {
    it = it->second > 0 ? std::next(it) : bytes.erase(it);
  }
  if (bytes.empty()) {
    device_settled_.erase(name);
  } else {
    device_settled_[name] = std::move(bytes);
  }
  ChangedLocked();
}

int64_t MemoryBudget::device_bytes(const std::string& name, int device) const {
  inferd::ReaderMutexLock lock(&mu_);
  auto it = device_settled_.find(name);
  if (it == device_settled_.end()) return 0;
  auto d = it->second.find(device);
  return d == it->second.end() ? 0 : d->second;
}

std::string MemoryBudget::DeviceVictim(const std::string& name, int device,
                                       const Models& models) {
  inferd::MutexLock lock(&mu_);
  // The policy sees the requests counted since it last looked, as in TryReserve.
  if (!models.used.empty()) policy_->OnUsedBatch(models.used);
  auto on_device = [&](const std::string& n) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = device_settled_.find(n);
    return it != device_settled_.end() && it->second.count(device) > 0;
  };
  auto evictable = [&](const std::string& n) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return n != name && models.idle.count(n) > 0 && on_device(n);
  };
  // The policy's order, one victim: asked to free one byte of a budget of none, it names the
  // model it would give up first among those `evictable` allows. The device is measured again
  // after each eviction, so the policy's own byte counts (host memory) do not decide how many.
  auto chosen = policy_->ChooseVictims(/*needed_bytes=*/0, /*resident_bytes=*/1,
                                       /*budget_bytes=*/0, evictable);
  if (!chosen.ok() || chosen->empty()) return std::string();
  return chosen->front();
}

std::string MemoryBudget::DeviceHolders(int device, const Models& models) const {
  inferd::ReaderMutexLock lock(&mu_);
  std::vector<std::string> held;
  for (const auto& [n, devices] : device_settled_) {
    auto d = devices.find(device);
    if (d == devices.end()) continue;
    auto why = models.why.find(n);
    held.push_back(StrCat(n, " ", d->second >> 20, " MiB (",
                          why == models.why.end() ? "in use" : why->second, ")"));
  }
  return held.empty() ? std::string("no model of this server") : StrJoin(held, ", ");
}

void MemoryBudget::NoteOverhead(int64_t bytes) {
  inferd::MutexLock lock(&mu_);
  overhead_ = std::max(overhead_, bytes);
}

int64_t MemoryBudget::Estimate(int64_t last_footprint, int64_t on_disk, bool from_disk) const {
  inferd::ReaderMutexLock lock(&mu_);
  int64_t estimate = std::max(on_disk, last_footprint);
  if (last_footprint == 0 && !from_disk) estimate = on_disk + overhead_;
  return estimate;
}

int64_t MemoryBudget::resident_bytes() const {
  inferd::ReaderMutexLock lock(&mu_);
  return ResidentLocked();
}

int64_t MemoryBudget::reserved_bytes() const {
  inferd::ReaderMutexLock lock(&mu_);
  return reserved_;
}

int64_t MemoryBudget::settled_bytes(const std::string& name) const {
  inferd::ReaderMutexLock lock(&mu_);
  auto it = settled_.find(name);
  return it == settled_.end() ? 0 : it->second;
}

}  // namespace inferd::repository
