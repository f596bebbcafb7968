#include "scheduling/deadline_sweeper.h"

#include <algorithm>

#include "absl/time/time.h"
#include "core/infer_request.h"

namespace inferd::scheduling {

DeadlineSweeper::DeadlineSweeper() : thread_([this] { Loop(); }) {}

DeadlineSweeper::~DeadlineSweeper() {
  {
    inferd::MutexLock lock(&mu_);
    stopping_ = true;
  }
  wake_.SignalAll();
  thread_.join();
}

DeadlineSweeper* DeadlineSweeper::Shared() {
  static DeadlineSweeper* const shared = new DeadlineSweeper();
  return shared;
}

std::unique_ptr<DeadlineSweeper::Client> DeadlineSweeper::Register(
    std::function<uint64_t(uint64_t)> sweep) {
  std::unique_ptr<Client> client(new Client(this, std::move(sweep)));
  inferd::MutexLock lock(&mu_);
  clients_.push_back({client.get(), 0});
  return client;
}

DeadlineSweeper::Client::~Client() {
  inferd::MutexLock lock(&owner_->mu_);
  while (owner_->running_ == this) owner_->finished_.Wait(&owner_->mu_);
  auto& list = owner_->clients_;
  list.erase(std::find_if(list.begin(), list.end(), [this](const Entry& e) { return e.client == this; }));
}

void DeadlineSweeper::WakeAt(Client* client, uint64_t ns) {
  bool earlier = false;
  {
    inferd::MutexLock lock(&mu_);
    for (Entry& e : clients_) {
      if (e.client != client) continue;
      earlier = e.wake_ns == 0 || ns < e.wake_ns;
      if (earlier) e.wake_ns = ns;
      break;
    }
  }
  if (earlier) wake_.Signal();
}

void DeadlineSweeper::Loop() {
  mu_.Lock();
  while (!stopping_) {
    Entry* next = nullptr;
    for (Entry& e : clients_) {
      if (e.wake_ns != 0 && (next == nullptr || e.wake_ns < next->wake_ns)) next = &e;
    }
    const uint64_t now = core::NowNs();
    if (next == nullptr) {
      wake_.Wait(&mu_);
      continue;
    }
    if (next->wake_ns > now) {
      wake_.WaitWithTimeout(&mu_, absl::Nanoseconds(next->wake_ns - now));
      continue;
    }
    next->wake_ns = 0;
    Client* client = next->client;  // `next` may move while mu_ is released
    running_ = client;
    mu_.Unlock();
    const uint64_t again = client->sweep_(now);
    mu_.Lock();
    running_ = nullptr;
    if (again != 0) {
      for (Entry& e : clients_) {
        if (e.client == client && (e.wake_ns == 0 || again < e.wake_ns)) e.wake_ns = again;
      }
    }
    finished_.SignalAll();
  }
  mu_.Unlock();
}

}  // namespace inferd::scheduling
