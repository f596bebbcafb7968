// Triton's sequence batcher (`sequence_batching`): requests carry a correlation ID
// (sequence_id) and START/END flags; every request of a live sequence runs on the sequence's
// slot, one at a time and in arrival order, so a stateful model sees the sequence in order.
//
// - Slots: `direct` gives each instance max(1, max_batch_size) slots and runs a sequence always
//   on its slot's instance; `oldest` keeps max_candidate_sequences candidate slots and batches
//   the oldest ready requests of different sequences onto any free instance (preferred sizes,
//   max_queue_delay_microseconds, as the dynamic batcher). A new sequence with no free slot
//   waits in the backlog (as Triton), bounded by --max-queue-size (503 past it).
// - Control inputs START, END, READY and CORRID are added to each request as tensors of shape
//   [1] ([1, 1] when the model batches) in the types the config names.
// - Implicit state (`state`): the server keeps each sequence's state tensors; a START request
//   gets the initial state (zeros, or <model>/initial_state/<data_file>), later ones the state
//   output of the request before, and the state outputs never reach the client.
// - A sequence idle longer than max_sequence_idle_microseconds (default 1 s) loses its slot; its
//   next request without START is refused naming the sequence and the idle limit.
// - A START for a live sequence restarts it (as Triton: a warning, the state starts over); a
//   request of an unknown sequence without START is refused (INVALID_ARGUMENT).
//
// Threads: one batcher thread forms batches and expires idle sequences and submits each batch
// to the model's InstancePool, which runs it (and stops it when its clients all cancel).
// Thread-safe. Locking: mu_ guards sequences, slots and queues; completions run outside it.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "backends/backend.h"
#include "common/mutex.h"
#include "config/model_config_util.h"
#include "metrics/model_stats.h"
#include "scheduling/batch_policy.h"
#include "scheduling/instance_pool.h"
#include "scheduling/scheduler.h"

namespace inferd::scheduling {

// The config the backend sees for a model with sequence_batching: `config` plus one input per
// control input and one input and output per state, so a backend that binds the config's
// tensors by name binds them too. The client-visible config stays without them. Fails with
// INVALID_ARGUMENT naming what is wrong in sequence_batching.
absl::StatusOr<config::ModelConfig> SequenceBackendConfig(const config::ModelConfig& config);

class SequenceBatcher : public Scheduler {
 public:
  // `config` is the client-visible config (validated by SequenceBackendConfig); `model_dir`
  // holds initial_state/. `stats` must outlive the batcher; `now_ns` is the clock.
  static absl::StatusOr<std::unique_ptr<SequenceBatcher>> Create(
      const config::ModelConfig& config, const std::string& model_dir, int64_t version,
      std::vector<std::unique_ptr<backends::ModelInstance>> instances, size_t max_queue_size,
      metrics::ModelStats* stats, std::function<uint64_t()> now_ns = core::NowNs);
  ~SequenceBatcher() override;

  void Enqueue(std::unique_ptr<core::InferRequest> request) override;
  void Shutdown() override;
  size_t InFlight() const override;
  size_t Queued() const override;

  // What one control input feeds the model.
  struct Control {
    std::string name;
    inference::ModelSequenceBatching::Control::Kind kind;
    DataType type = DataType::kInvalid;
    std::string false_bytes, true_bytes;  // START, END, READY
  };
  struct StateSpec {
    std::string input, output;
    DataType type = DataType::kInvalid;
    Shape initial_shape;  // per request, batch dimension included when batching
    std::string initial;
  };

 private:
  struct Item {
    std::unique_ptr<core::InferRequest> request;
    uint64_t enqueue_ns = 0;
    std::string shape_key;
  };
  struct Sequence {
    std::string key;    // "u<number>" or "s<text>"
    std::string label;  // for messages: 42 or 'abc'
    int slot = -1;      // -1: in the backlog
    bool ended = false;      // its END request arrived; released once drained
    bool executing = false;  // one of its requests is in a batch now
    uint64_t last_ns = 0;    // last arrival or completion, for the idle limit
    std::deque<Item> queue;
    std::vector<std::string> state;
    std::vector<Shape> state_shape;
  };

  SequenceBatcher(const config::ModelConfig& config, int64_t version,
                  std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                  size_t max_queue_size, metrics::ModelStats* stats,
                  std::function<uint64_t()> now_ns);
  void Start();
  size_t SlotsForLog();

  void BatcherLoop();
  // On the instance thread, after a run: keeps `seq`'s state outputs for its next request and
  // takes them out of the response (the client never sees them).
  void KeepState(Sequence* seq, core::InferResponse& response);
  // Picks the next batch for idle runner `runner`; 0 in *wait_until: wait for an event.
  std::vector<Sequence*> PickLocked(size_t runner, uint64_t now, uint64_t* wait_until)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adds the control and state tensors to the request about to run for `seq`.
  void InjectLocked(Sequence* seq, core::InferRequest* request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees `slot` and gives it to the oldest backlogged sequence.
  void ReleaseSlotLocked(int slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases sequences idle past the limit; returns the next time one may become idle (0: none).
  uint64_t ExpireIdleLocked(uint64_t now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RememberExpiredLocked(const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  size_t QueuedLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool SlotReadyLocked(int slot) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes the queued requests whose client left or whose deadline passed off the fronts of the
  // slots' queues (they are answered unrun; the sequence's state is untouched).
  std::vector<std::unique_ptr<core::InferRequest>> DropAbandonedLocked(uint64_t now_ns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckRequest(const core::InferRequest& r) const;

  const std::string model_name_;
  const int64_t version_;
  const bool batching_;
  const bool oldest_;
  const int64_t slots_per_runner_;  // direct
  const uint64_t idle_ns_;
  const BatchPolicy policy_;              // oldest
  const uint64_t direct_delay_ns_;
  const float direct_min_utilization_;
  const size_t max_queue_size_;
  metrics::ModelStats* const stats_;
  const std::function<uint64_t()> now_ns_;
  std::vector<Control> controls_;
  std::vector<StateSpec> states_;
  DataType corrid_type_ = DataType::kInvalid;  // kInvalid: no CORRID control

  mutable inferd::Mutex mu_;
  inferd::CondVar batcher_cv_;
  // Slot i holds a sequence or null; direct: slot / slots_per_runner_ is its runner.
  std::vector<std::unique_ptr<Sequence>> slots_ ABSL_GUARDED_BY(mu_);
  std::deque<std::unique_ptr<Sequence>> backlog_ ABSL_GUARDED_BY(mu_);
  // Sequences that have not seen their END, by key.
  absl::flat_hash_map<std::string, Sequence*> live_ ABSL_GUARDED_BY(mu_);
  // Keys of sequences released for idling (most recent 4,096), for the refusal's reason.
  std::deque<std::string> expired_order_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> expired_ ABSL_GUARDED_BY(mu_);
  size_t queued_ ABSL_GUARDED_BY(mu_) = 0;          // not yet running, backlog included
  size_t backlog_queued_ ABSL_GUARDED_BY(mu_) = 0;  // of those, in the backlog
  size_t executing_ ABSL_GUARDED_BY(mu_) = 0;
  // Instances free for a batch, as the pool reported them (on_free) and this thread took them.
  std::vector<bool> idle_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;

  // Declared after the sequences: destroyed first, so no instance thread runs on. Runner i of
  // `direct` is instance i.
  InstancePool pool_;
  std::thread batcher_;
};

}  // namespace inferd::scheduling
