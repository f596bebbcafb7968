#include "scheduling/sequence_batcher.h"

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "absl/time/time.h"
#include "common/logging.h"
#include "common/strings.h"

namespace inferd::scheduling {
namespace {

using SB = inference::ModelSequenceBatching;
constexpr uint64_t kDefaultIdleUs = 1000000;  // Triton's default max_sequence_idle_microseconds
constexpr size_t kExpiredRemembered = 4096;

std::string_view KindName(SB::Control::Kind kind) {
  switch (kind) {
    case SB::Control::CONTROL_SEQUENCE_START: return "CONTROL_SEQUENCE_START";
    case SB::Control::CONTROL_SEQUENCE_READY: return "CONTROL_SEQUENCE_READY";
    case SB::Control::CONTROL_SEQUENCE_END: return "CONTROL_SEQUENCE_END";
    case SB::Control::CONTROL_SEQUENCE_CORRID: return "CONTROL_SEQUENCE_CORRID";
    default: return "unknown";
  }
}

template <typename T>
std::string Bytes(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

absl::Status Bad(const config::ModelConfig& config, std::string_view what) {
  return absl::InvalidArgumentError(
      StrCat("model '", config.name(), "': sequence_batching: ", what));
}

// Reads and checks every control input.
absl::StatusOr<std::vector<SequenceBatcher::Control>> ParseControls(
    const config::ModelConfig& config) {
  std::vector<SequenceBatcher::Control> out;
  bool seen[4] = {};
  for (const auto& ci : config.sequence_batching().control_input()) {
    if (ci.name().empty()) return Bad(config, "a control_input has no name");
    // One tensor cannot carry two controls (Triton refuses it too): the model would read
    // whichever value was written last.
    for (const auto& earlier : out) {
      if (earlier.name == ci.name()) {
        return Bad(config, StrCat("control tensor '", ci.name(), "' is given for more than one "
                                  "control kind"));
      }
    }
    if (ci.control_size() != 1) {
      return Bad(config, StrCat("control_input '", ci.name(), "' must have exactly one control (has ",
                                ci.control_size(), ")"));
    }
    const auto& c = ci.control(0);
    SequenceBatcher::Control ctl;
    ctl.name = ci.name();
    ctl.kind = c.kind();
    if (c.kind() < 0 || c.kind() > 3) return Bad(config, StrCat("control_input '", ci.name(), "': unknown kind"));
    if (seen[c.kind()]) {
      return Bad(config, StrCat("more than one control_input has kind ", KindName(c.kind())));
    }
    seen[c.kind()] = true;
    if (c.kind() == SB::Control::CONTROL_SEQUENCE_CORRID) {
      ctl.type = config::FromProto(c.data_type());
      if (ctl.type != DataType::kUint64 && ctl.type != DataType::kInt64 &&
          ctl.type != DataType::kUint32 && ctl.type != DataType::kInt32 &&
          ctl.type != DataType::kBytes) {
        return Bad(config, StrCat("control_input '", ci.name(),
                                  "': CONTROL_SEQUENCE_CORRID data_type must be TYPE_UINT64, "
                                  "TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING, not ",
                                  config::ProtoTypeName(c.data_type())));
      }
      if (c.int32_false_true_size() || c.fp32_false_true_size() || c.bool_false_true_size()) {
        return Bad(config, StrCat("control_input '", ci.name(),
                                  "': CONTROL_SEQUENCE_CORRID takes data_type, not *_false_true"));
      }
    } else {
      const int given = (c.int32_false_true_size() > 0) + (c.fp32_false_true_size() > 0) +
                        (c.bool_false_true_size() > 0);
      if (given != 1 || c.data_type() != inference::TYPE_INVALID) {
        return Bad(config, StrCat("control_input '", ci.name(), "': ", KindName(c.kind()),
                                  " takes exactly one of int32_false_true, fp32_false_true, "
                                  "bool_false_true (and no data_type)"));
      }
      const int n = c.int32_false_true_size() + c.fp32_false_true_size() + c.bool_false_true_size();
      if (n != 2) {
        return Bad(config, StrCat("control_input '", ci.name(),
                                  "': *_false_true must hold two values, false then true"));
      }
      if (c.int32_false_true_size()) {
        ctl.type = DataType::kInt32;
        ctl.false_bytes = Bytes<int32_t>(c.int32_false_true(0));
        ctl.true_bytes = Bytes<int32_t>(c.int32_false_true(1));
      } else if (c.fp32_false_true_size()) {
        ctl.type = DataType::kFp32;
        ctl.false_bytes = Bytes<float>(c.fp32_false_true(0));
        ctl.true_bytes = Bytes<float>(c.fp32_false_true(1));
      } else {
        ctl.type = DataType::kBool;
        ctl.false_bytes = std::string(1, c.bool_false_true(0) ? 1 : 0);
        ctl.true_bytes = std::string(1, c.bool_false_true(1) ? 1 : 0);
      }
    }
    for (const auto& in : config.input()) {
      if (in.name() == ci.name()) {
        return Bad(config, StrCat("control_input '", ci.name(),
                                  "' is also listed under input; the server supplies it, remove it there"));
      }
    }
    out.push_back(std::move(ctl));
  }
  return out;
}

absl::StatusOr<std::vector<SequenceBatcher::StateSpec>> ParseStates(
    const config::ModelConfig& config, const std::string* model_dir) {
  std::vector<SequenceBatcher::StateSpec> out;
  const bool batching = config.max_batch_size() > 0;
  for (const auto& st : config.sequence_batching().state()) {
    SequenceBatcher::StateSpec s;
    s.input = st.input_name();
    s.output = st.output_name();
    if (s.input.empty() || s.output.empty()) {
      return Bad(config, "a state needs both input_name and output_name");
    }
    s.type = config::FromProto(st.data_type());
    if (s.type == DataType::kInvalid) {
      return Bad(config, StrCat("state '", s.input, "': data_type is missing or invalid"));
    }
    if (st.dims_size() == 0) return Bad(config, StrCat("state '", s.input, "': dims are missing"));
    for (const auto& in : config.input()) {
      if (in.name() == s.input) {
        return Bad(config, StrCat("state input '", s.input,
                                  "' is also listed under input; the server supplies it, remove it there"));
      }
    }
    for (const auto& o : config.output()) {
      if (o.name() == s.output) {
        return Bad(config, StrCat("state output '", s.output,
                                  "' is also listed under output; the server keeps it, remove it there"));
      }
    }
    if (st.initial_state_size() > 1) {
      return Bad(config, StrCat("state '", s.input, "': at most one initial_state"));
    }
    Shape dims;
    if (st.initial_state_size() == 1) {
      const auto& init = st.initial_state(0);
      if (config::FromProto(init.data_type()) != s.type) {
        return Bad(config, StrCat("state '", s.input, "': initial_state data_type ",
                                  config::ProtoTypeName(init.data_type()), " differs from the state's ",
                                  config::ProtoTypeName(st.data_type())));
      }
      dims.assign(init.dims().begin(), init.dims().end());
      if (dims.size() != static_cast<size_t>(st.dims_size())) {
        return Bad(config, StrCat("state '", s.input, "': initial_state dims must have as many "
                                  "dimensions as the state's dims"));
      }
      for (int i = 0; i < st.dims_size(); ++i) {
        if (dims[i] < 0 || (st.dims(i) >= 0 && st.dims(i) != dims[i])) {
          return Bad(config, StrCat("state '", s.input, "': initial_state dims do not match the "
                                    "state's dims (each fixed, equal where the state fixes it)"));
        }
      }
      if (init.state_data_case() == SB::InitialState::STATE_DATA_NOT_SET) {
        return Bad(config, StrCat("state '", s.input, "': initial_state needs zero_data or data_file"));
      }
    } else {
      dims.assign(st.dims().begin(), st.dims().end());
      for (int64_t d : dims) {
        if (d < 0) {
          return Bad(config, StrCat("state '", s.input, "' has variable dims; give an initial_state "
                                    "with fixed dims"));
        }
      }
    }
    auto count = ElementCount(dims);
    if (!count.ok()) return Bad(config, StrCat("state '", s.input, "': ", count.status().message()));
    const bool from_file = st.initial_state_size() == 1 && st.initial_state(0).has_data_file();
    if (from_file && model_dir != nullptr) {
      const std::string path = StrCat(*model_dir, "/initial_state/", st.initial_state(0).data_file());
      std::ifstream f(path, std::ios::binary);
      if (!f) {
        return absl::NotFoundError(StrCat("model '", config.name(), "': state '", s.input,
                                          "': cannot read initial_state data_file '", path, "'"));
      }
      s.initial.assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      if (s.type != DataType::kBytes &&
          s.initial.size() != static_cast<size_t>(*count) * DataTypeSize(s.type)) {
        return Bad(config, StrCat("state '", s.input, "': initial_state data_file '", path, "' has ",
                                  s.initial.size(), " bytes, expected ",
                                  static_cast<size_t>(*count) * DataTypeSize(s.type)));
      }
    } else if (s.type == DataType::kBytes) {
      s.initial.assign(static_cast<size_t>(*count) * 4, '\0');  // empty strings
    } else {
      s.initial.assign(static_cast<size_t>(*count) * DataTypeSize(s.type), '\0');
    }
    if (batching) s.initial_shape.push_back(1);
    s.initial_shape.insert(s.initial_shape.end(), dims.begin(), dims.end());
    out.push_back(std::move(s));
  }
  return out;
}

std::string ShapeKey(const core::InferRequest& r) {
  std::string key;
  for (const auto& in : r.inputs) {
    StrAppend(&key, in.name, ":", DataTypeName(in.datatype), ":");
    for (size_t i = 1; i < in.shape.size(); ++i) StrAppend(&key, in.shape[i], ",");
    key.push_back(';');
  }
  return key;
}

std::string SequenceKey(const core::CorrelationId& id) {
  return id.is_string ? StrCat("s", id.text) : StrCat("u", id.number);
}

std::string SequenceLabel(const core::CorrelationId& id) {
  return id.is_string ? StrCat("'", id.text, "'") : StrCat(id.number);
}

}  // namespace

absl::StatusOr<config::ModelConfig> SequenceBackendConfig(const config::ModelConfig& config) {
  const auto& sb = config.sequence_batching();
  if (sb.iterative_sequence()) {
    return Bad(config, "iterative_sequence (decoupled request rescheduling) is not implemented");
  }
  if (sb.has_oldest() && sb.oldest().max_candidate_sequences() < 0) {
    return Bad(config, "oldest.max_candidate_sequences must not be negative");
  }
  if (sb.has_oldest()) {
    for (int32_t p : sb.oldest().preferred_batch_size()) {
      if (p < 1 || p > std::max(1, config.max_batch_size())) {
        return Bad(config, StrCat("oldest.preferred_batch_size ", p, " must be 1 to max_batch_size (",
                                  config.max_batch_size(), ")"));
      }
    }
  }
  if (sb.has_direct() && (sb.direct().minimum_slot_utilization() < 0 ||
                          sb.direct().minimum_slot_utilization() > 1)) {
    return Bad(config, "direct.minimum_slot_utilization must be between 0 and 1");
  }
  auto controls = ParseControls(config);
  if (!controls.ok()) return controls.status();
  auto states = ParseStates(config, nullptr);
  if (!states.ok()) return states.status();
  config::ModelConfig out = config;
  for (const auto& c : *controls) {
    auto* in = out.add_input();
    in->set_name(c.name);
    in->set_data_type(config::ToProto(c.type));
    in->add_dims(1);
  }
  for (const auto& st : sb.state()) {
    auto* in = out.add_input();
    in->set_name(st.input_name());
    in->set_data_type(st.data_type());
    *in->mutable_dims() = st.dims();
    auto* o = out.add_output();
    o->set_name(st.output_name());
    o->set_data_type(st.data_type());
    *o->mutable_dims() = st.dims();
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SequenceBatcher>> SequenceBatcher::Create(
    const config::ModelConfig& config, const std::string& model_dir, int64_t version,
    std::vector<std::unique_ptr<backends::ModelInstance>> instances, size_t max_queue_size,
    metrics::ModelStats* stats, std::function<uint64_t()> now_ns) {
  if (auto checked = SequenceBackendConfig(config); !checked.ok()) return checked.status();
  auto controls = ParseControls(config);
  if (!controls.ok()) return controls.status();
  auto states = ParseStates(config, &model_dir);
  if (!states.ok()) return states.status();
  if (instances.empty()) return Bad(config, "the model has no instances");
  std::unique_ptr<SequenceBatcher> b(new SequenceBatcher(config, version, std::move(instances),
                                                         max_queue_size, stats, std::move(now_ns)));
  b->controls_ = *std::move(controls);
  b->states_ = *std::move(states);
  for (const auto& c : b->controls_) {
    if (c.kind == SB::Control::CONTROL_SEQUENCE_CORRID) b->corrid_type_ = c.type;
  }
  b->Start();
  return b;
}

SequenceBatcher::SequenceBatcher(const config::ModelConfig& config, int64_t version,
                                 std::vector<std::unique_ptr<backends::ModelInstance>> instances,
                                 size_t max_queue_size, metrics::ModelStats* stats,
                                 std::function<uint64_t()> now_ns)
    : model_name_(config.name()),
      version_(version),
      batching_(config.max_batch_size() > 0),
      oldest_(config.sequence_batching().has_oldest()),
      slots_per_runner_(std::max(1, config.max_batch_size())),
      idle_ns_((config.sequence_batching().max_sequence_idle_microseconds()
                    ? config.sequence_batching().max_sequence_idle_microseconds()
                    : kDefaultIdleUs) *
               1000),
      policy_([&config] {
        BatchPolicy p;
        p.max_batch_size = std::max(1, config.max_batch_size());
        for (int32_t s : config.sequence_batching().oldest().preferred_batch_size()) {
          p.preferred_batch_sizes.push_back(s);
        }
        p.max_queue_delay_ns = config.sequence_batching().oldest().max_queue_delay_microseconds() * 1000;
        return p;
      }()),
      direct_delay_ns_(config.sequence_batching().direct().max_queue_delay_microseconds() * 1000),
      direct_min_utilization_(config.sequence_batching().direct().minimum_slot_utilization()),
      max_queue_size_(max_queue_size),
      stats_(stats),
      now_ns_(std::move(now_ns)),
      pool_({.model_name = model_name_, .version = version_, .stats = stats_},
            std::move(instances), [this](size_t instance) {
              {
                inferd::MutexLock lock(&mu_);
                idle_[instance] = true;
              }
              batcher_cv_.Signal();  // outside the lock: the batcher can take it at once
            }) {
  // Triton: max_candidate_sequences defaults to max_batch_size.
  const int64_t candidates = config.sequence_batching().oldest().max_candidate_sequences() > 0
                                 ? config.sequence_batching().oldest().max_candidate_sequences()
                                 : std::max(1, config.max_batch_size());
  inferd::MutexLock lock(&mu_);
  const size_t slots = oldest_ ? static_cast<size_t>(candidates)
                               : pool_.size() * static_cast<size_t>(slots_per_runner_);
  slots_.resize(slots);
  idle_.assign(pool_.size(), true);
}

void SequenceBatcher::Start() {
  batcher_ = std::thread([this] { BatcherLoop(); });
  LOG_INFO << "model '" << model_name_ << "': sequence batcher, "
           << (oldest_ ? "oldest" : "direct") << " strategy, " << SlotsForLog() << " slot(s), "
           << controls_.size() << " control input(s), " << states_.size() << " state(s), idle limit "
           << idle_ns_ / 1000 << " us";
}

size_t SequenceBatcher::SlotsForLog() {
  inferd::MutexLock lock(&mu_);
  return slots_.size();
}

SequenceBatcher::~SequenceBatcher() { Shutdown(); }

absl::Status SequenceBatcher::CheckRequest(const core::InferRequest& r) const {
  if (r.sequence_id.empty()) {
    return absl::InvalidArgumentError(StrCat(
        "inference request to model '", model_name_,
        "' must specify a non-zero or non-empty correlation ID (the sequence_id parameter)"));
  }
  if (batching_ && r.batch_size != 1) {
    return absl::InvalidArgumentError(StrCat(
        "inference request for sequence ", SequenceLabel(r.sequence_id), " to model '", model_name_,
        "' must specify batch-size 1 due to requirements of sequence batcher (got ", r.batch_size, ")"));
  }
  if (r.sequence_id.is_string && corrid_type_ != DataType::kInvalid &&
      corrid_type_ != DataType::kBytes) {
    return absl::InvalidArgumentError(StrCat(
        "inference request for sequence ", SequenceLabel(r.sequence_id), " to model '", model_name_,
        "': the model's CONTROL_SEQUENCE_CORRID is ", DataTypeName(corrid_type_),
        ", so sequence_id must be an unsigned integer, not a string"));
  }
  return absl::OkStatus();
}

void SequenceBatcher::Enqueue(std::unique_ptr<core::InferRequest> request) {
  absl::Status refused = CheckRequest(*request);
  metrics::FailureReason reason = metrics::FailureReason::kOther;
  bool restarted = false;
  if (refused.ok()) {
    inferd::MutexLock lock(&mu_);
    // Idle sequences lose their slots now, not when the batcher thread next wakes.
    ExpireIdleLocked(now_ns_());
    const std::string key = SequenceKey(request->sequence_id);
    auto it = live_.find(key);
    if (stopping_) {
      refused = absl::UnavailableError(
          StrCat("model '", model_name_, "' version ", version_, " is unloading"));
      reason = metrics::FailureReason::kRejected;
    } else if (it == live_.end() && !request->sequence_start) {
      std::string why;
      if (expired_.contains(key)) {
        why = StrCat(": the sequence was released after being idle longer than "
                     "max_sequence_idle_microseconds (", idle_ns_ / 1000, " us)");
      }
      refused = absl::InvalidArgumentError(
          StrCat("inference request for sequence ", SequenceLabel(request->sequence_id),
                 " to model '", model_name_,
                 "' must specify the START flag on the first request of the sequence", why));
    } else if (const size_t waiting = it == live_.end() || it->second->slot < 0
                                          ? backlog_queued_
                                          : it->second->queue.size();
               waiting >= max_queue_size_) {
      // Bounded: the backlog (sequences without a slot) and each slot's own queue.
      refused = absl::UnavailableError(StrCat(
          "model '", model_name_, "': sequence ", SequenceLabel(request->sequence_id), " refused, ",
          waiting, " requests already wait ",
          it == live_.end() || it->second->slot < 0 ? "for a free sequence slot" : "in its slot",
          " (--max-queue-size); retry later"));
      reason = metrics::FailureReason::kRejected;
    } else {
      Sequence* seq;
      if (it != live_.end()) {
        seq = it->second;
        restarted = request->sequence_start;
      } else {
        auto fresh = std::make_unique<Sequence>();
        fresh->key = key;
        fresh->label = SequenceLabel(request->sequence_id);
        seq = fresh.get();
        live_[key] = seq;
        if (expired_.erase(key)) {
          expired_order_.erase(std::find(expired_order_.begin(), expired_order_.end(), key));
        }
        auto free_slot = std::find(slots_.begin(), slots_.end(), nullptr);
        if (free_slot != slots_.end() && backlog_.empty()) {
          fresh->slot = static_cast<int>(free_slot - slots_.begin());
          *free_slot = std::move(fresh);
        } else {
          backlog_.push_back(std::move(fresh));
        }
      }
      seq->last_ns = now_ns_();
      if (request->sequence_end) {
        seq->ended = true;
        live_.erase(key);  // a later START with this ID begins a new sequence
      }
      request->times.queue_start_ns = core::NowNs();
      Item item;
      item.enqueue_ns = seq->last_ns;
      item.shape_key = ShapeKey(*request);
      item.request = std::move(request);
      seq->queue.push_back(std::move(item));
      ++queued_;
      if (seq->slot < 0) ++backlog_queued_;
    }
  }
  if (!refused.ok()) {
    stats_->RecordFailure(core::NowNs() - request->times.received_ns, reason);
    core::CompleteWithError(std::move(request), std::move(refused));
    return;
  }
  if (restarted) {
    LOG_WARNING << "model '" << model_name_ << "': sequence started again before its END; the "
                << "previous sequence ends early and its state starts over";
  }
  batcher_cv_.Signal();
}

size_t SequenceBatcher::QueuedLocked() const { return queued_; }

size_t SequenceBatcher::Queued() const {
  inferd::MutexLock lock(&mu_);
  return queued_;
}

std::vector<std::unique_ptr<core::InferRequest>> SequenceBatcher::DropAbandonedLocked(
    uint64_t now_ns) {
  std::vector<std::unique_ptr<core::InferRequest>> dropped;
  for (auto& seq : slots_) {
    if (seq == nullptr || seq->executing) continue;
    while (!seq->queue.empty()) {
      const core::InferRequest& r = *seq->queue.front().request;
      const bool cancelled = r.cancel != nullptr && r.cancel->IsCancelled();
      const bool expired = r.deadline_ns != 0 && now_ns >= r.deadline_ns;
      if (!cancelled && !expired) break;
      dropped.push_back(std::move(seq->queue.front().request));
      seq->queue.pop_front();
      --queued_;
    }
  }
  return dropped;
}

bool SequenceBatcher::SlotReadyLocked(int slot) const {
  const Sequence* s = slots_[slot].get();
  return s != nullptr && !s->executing && !s->queue.empty();
}

void SequenceBatcher::RememberExpiredLocked(const std::string& key) {
  if (!expired_.insert(key).second) return;
  expired_order_.push_back(key);
  if (expired_order_.size() > kExpiredRemembered) {
    expired_.erase(expired_order_.front());
    expired_order_.pop_front();
  }
}

void SequenceBatcher::ReleaseSlotLocked(int slot) {
  slots_[slot].reset();
  if (!backlog_.empty()) {
    std::unique_ptr<Sequence> next = std::move(backlog_.front());
    backlog_.pop_front();
    next->slot = slot;
    backlog_queued_ -= next->queue.size();
    next->last_ns = now_ns_();  // its idle time counts from when it gets a slot
    slots_[slot] = std::move(next);
  }
}

uint64_t SequenceBatcher::ExpireIdleLocked(uint64_t now) {
  uint64_t next = 0;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Sequence* s = slots_[i].get();
    if (s == nullptr || s->executing || !s->queue.empty()) continue;
    if (s->ended) {  // drained after its END
      ReleaseSlotLocked(static_cast<int>(i));
      continue;
    }
    const uint64_t deadline = s->last_ns + idle_ns_;
    if (now >= deadline) {
      LOG_WARNING << "model '" << model_name_ << "': sequence " << s->label
                  << " released after being idle for more than " << idle_ns_ / 1000 << " us";
      RememberExpiredLocked(s->key);
      live_.erase(s->key);
      ReleaseSlotLocked(static_cast<int>(i));
      // The slot may have gone to a backlogged sequence with requests: look at it again.
      if (slots_[i] != nullptr) --i;
      continue;
    }
    if (next == 0 || deadline < next) next = deadline;
  }
  return next;
}

std::vector<SequenceBatcher::Sequence*> SequenceBatcher::PickLocked(size_t runner, uint64_t now,
                                                                    uint64_t* wait_until) {
  *wait_until = 0;
  std::vector<Sequence*> picked;
  if (!oldest_) {
    const int first = static_cast<int>(runner * slots_per_runner_);
    uint64_t oldest = 0;
    for (int s = first; s < first + slots_per_runner_; ++s) {
      if (!SlotReadyLocked(s)) continue;
      picked.push_back(slots_[s].get());
      const uint64_t t = slots_[s]->queue.front().enqueue_ns;
      if (oldest == 0 || t < oldest) oldest = t;
    }
    if (picked.empty() || direct_delay_ns_ == 0 || stopping_) return picked;
    const bool full = static_cast<int64_t>(picked.size()) >= slots_per_runner_ ||
                      (direct_min_utilization_ > 0 &&
                       static_cast<float>(picked.size()) / slots_per_runner_ >= direct_min_utilization_);
    if (full || now >= oldest + direct_delay_ns_) return picked;
    *wait_until = oldest + direct_delay_ns_;
    picked.clear();
    return picked;
  }
  std::vector<Sequence*> ready;
  for (size_t s = 0; s < slots_.size(); ++s) {
    if (SlotReadyLocked(static_cast<int>(s))) ready.push_back(slots_[s].get());
  }
  if (ready.empty()) return picked;
  std::stable_sort(ready.begin(), ready.end(), [](const Sequence* a, const Sequence* b) {
    return a->queue.front().enqueue_ns < b->queue.front().enqueue_ns;
  });
  std::vector<QueuedItem> items;
  items.reserve(ready.size());
  for (Sequence* s : ready) {
    const Item& it = s->queue.front();
    items.push_back({it.enqueue_ns, it.request->batch_size, &it.shape_key});
  }
  BatchPolicy policy = policy_;
  if (stopping_) policy.max_queue_delay_ns = 0;
  const BatchDecision d = DecideBatch(policy, items, now);
  if (d.take == 0) {
    *wait_until = d.wait_until_ns;
    return picked;
  }
  picked.assign(ready.begin(), ready.begin() + static_cast<std::ptrdiff_t>(d.take));
  return picked;
}

void SequenceBatcher::InjectLocked(Sequence* seq, core::InferRequest* r) {
  const Shape control_shape = batching_ ? Shape{1, 1} : Shape{1};
  for (const Control& c : controls_) {
    std::string bytes;
    switch (c.kind) {
      case SB::Control::CONTROL_SEQUENCE_START:
        bytes = r->sequence_start ? c.true_bytes : c.false_bytes;
        break;
      case SB::Control::CONTROL_SEQUENCE_END:
        bytes = r->sequence_end ? c.true_bytes : c.false_bytes;
        break;
      case SB::Control::CONTROL_SEQUENCE_READY:
        bytes = c.true_bytes;
        break;
      default: {  // CORRID
        const core::CorrelationId& id = r->sequence_id;
        switch (c.type) {
          case DataType::kUint64: bytes = Bytes<uint64_t>(id.number); break;
          case DataType::kInt64: bytes = Bytes<int64_t>(static_cast<int64_t>(id.number)); break;
          case DataType::kUint32: bytes = Bytes<uint32_t>(static_cast<uint32_t>(id.number)); break;
          case DataType::kInt32: bytes = Bytes<int32_t>(static_cast<int32_t>(id.number)); break;
          default: {
            const std::string text = id.is_string ? id.text : StrCat(id.number);
            bytes = Bytes<uint32_t>(static_cast<uint32_t>(text.size())) + text;
          }
        }
      }
    }
    core::InputTensor t;
    t.name = c.name;
    t.datatype = c.type;
    t.shape = control_shape;
    t.data = r->owned.emplace_back(std::move(bytes));
    r->inputs.push_back(std::move(t));
  }
  if (seq->state.size() != states_.size()) {
    seq->state.resize(states_.size());
    seq->state_shape.resize(states_.size());
    for (size_t i = 0; i < states_.size(); ++i) {
      seq->state[i] = states_[i].initial;
      seq->state_shape[i] = states_[i].initial_shape;
    }
  }
  for (size_t i = 0; i < states_.size(); ++i) {
    const StateSpec& s = states_[i];
    if (r->sequence_start) {
      seq->state[i] = s.initial;
      seq->state_shape[i] = s.initial_shape;
    }
    core::InputTensor t;
    t.name = s.input;
    t.datatype = s.type;
    t.shape = seq->state_shape[i];
    t.data = r->owned.emplace_back(seq->state[i]);
    r->inputs.push_back(std::move(t));
    // A client naming its outputs names only the model's; ask for the state output too.
    if (!r->outputs.empty()) r->outputs.push_back(core::RequestedOutput{.name = s.output});
  }
}

void SequenceBatcher::BatcherLoop() {
  mu_.Lock();
  for (;;) {
    const uint64_t now = now_ns_();
    uint64_t wake = ExpireIdleLocked(now);
    if (stopping_ && !backlog_.empty()) {
      // Backlogged sequences would wait for slots that may never free: refuse them.
      std::vector<std::unique_ptr<core::InferRequest>> refused;
      for (auto& seq : backlog_) {
        for (auto& item : seq->queue) refused.push_back(std::move(item.request));
        queued_ -= seq->queue.size();
        backlog_queued_ -= seq->queue.size();
        if (!seq->ended) live_.erase(seq->key);
      }
      backlog_.clear();
      mu_.Unlock();
      for (auto& r : refused) {
        stats_->RecordFailure(core::NowNs() - r->times.received_ns, metrics::FailureReason::kRejected);
        core::CompleteWithError(std::move(r), absl::UnavailableError(StrCat(
            "model '", model_name_, "' version ", version_, " is unloading; sequence ",
            SequenceLabel(r->sequence_id), " never got a slot")));
      }
      mu_.Lock();
      continue;
    }
    if (auto dropped = DropAbandonedLocked(core::NowNs()); !dropped.empty()) {
      mu_.Unlock();
      for (auto& r : dropped) {
        const bool cancelled = r->cancel != nullptr && r->cancel->IsCancelled();
        stats_->RecordFailure(core::NowNs() - r->times.received_ns,
                              cancelled ? metrics::FailureReason::kCanceled
                                        : metrics::FailureReason::kTimeout);
        const std::string what = StrCat("request for sequence ", SequenceLabel(r->sequence_id),
                                        " of model '", model_name_, "'");
        core::CompleteWithError(
            std::move(r), cancelled ? absl::CancelledError(StrCat(what, " was cancelled"))
                                    : absl::DeadlineExceededError(
                                          StrCat(what, " passed its deadline in the queue")));
      }
      mu_.Lock();
      continue;
    }
    bool assigned = false;
    for (size_t i = 0; i < pool_.size(); ++i) {
      if (!idle_[i]) continue;
      uint64_t wait_until = 0;
      std::vector<Sequence*> picked = PickLocked(i, now, &wait_until);
      if (wait_until && (wake == 0 || wait_until < wake)) wake = wait_until;
      if (picked.empty()) continue;
      Batch batch;
      for (Sequence* seq : picked) {
        Item item = std::move(seq->queue.front());
        seq->queue.pop_front();
        --queued_;
        seq->executing = true;
        InjectLocked(seq, item.request.get());
        batch.requests.push_back(std::move(item.request));
      }
      executing_ += picked.size();
      // The sequences stay `executing` until their responses are delivered, so neither the
      // batcher nor the idle reaper touches their state meanwhile, and a sequence's responses
      // leave in order.
      batch.after_execute = [this, picked](size_t k, core::InferResponse& response) {
        KeepState(picked[k], response);
      };
      batch.after_delivery = [this, picked] {
        const uint64_t done_ns = now_ns_();  // idle time counts from the answer
        inferd::MutexLock lock(&mu_);
        for (Sequence* seq : picked) {
          seq->executing = false;
          seq->last_ns = done_ns;
        }
        executing_ -= picked.size();
      };
      idle_[i] = false;
      pool_.Submit(i, std::move(batch));
      assigned = true;
      if (oldest_) break;  // the next runner sees the slots as they are now
    }
    if (assigned) continue;
    if (stopping_ && queued_ == 0 && executing_ == 0) break;
    if (wake) {
      batcher_cv_.WaitWithTimeout(&mu_, absl::Nanoseconds(wake > now ? wake - now : 0));
    } else {
      batcher_cv_.Wait(&mu_);
    }
  }
  mu_.Unlock();
}

void SequenceBatcher::KeepState(Sequence* seq, core::InferResponse& resp) {
  if (!resp.status.ok()) return;
  for (size_t s = 0; s < states_.size(); ++s) {
    auto out = std::find_if(resp.outputs.begin(), resp.outputs.end(),
                            [&](const core::OutputTensor& o) { return o.name == states_[s].output; });
    if (out == resp.outputs.end()) {
      resp.status = absl::InternalError(
          StrCat("model '", model_name_, "' returned no state output '", states_[s].output, "'"));
      resp.outputs.clear();
      return;
    }
    seq->state[s].assign(out->data.data(), out->data.size());
    seq->state_shape[s] = out->shape;
    resp.outputs.erase(out);
  }
}

void SequenceBatcher::Shutdown() {
  {
    inferd::MutexLock lock(&mu_);
    if (stopping_ && !batcher_.joinable()) return;
    stopping_ = true;
  }
  batcher_cv_.SignalAll();
  if (batcher_.joinable()) batcher_.join();  // returns once every queued request has run
  pool_.Shutdown();
}

size_t SequenceBatcher::InFlight() const {
  inferd::MutexLock lock(&mu_);
  return queued_ + executing_;
}

}  // namespace inferd::scheduling
