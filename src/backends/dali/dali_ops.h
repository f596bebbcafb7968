// The DALI operators inferd runs, on the CPU, with DALI's documented semantics: what each
// operator computes from its arguments, per sample. A pipeline's operators are built once at
// load (MakeOperator reads and checks every argument, so a bad or unsupported one fails the
// load naming it) and run for each batch.
//
// Values are held as float whatever their DALI type (uint8 pixels are exact integers in a
// float); an operator whose output type is an integer type rounds to nearest (ties to even) and
// saturates, as DALI's ConvertSat does. 64-bit integers beyond 2^24 lose precision: no operator
// here produces them from images.
//
// Thread safety: an Operator is immutable after MakeOperator; Run may be called from several
// threads at once.
#pragma once

#include <functional>
#include <memory>
#include <new>
#include <utility>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "backends/dali/dali_pipeline.h"

namespace inferd::backends::dali {

// A float vector whose resize() leaves new elements uninitialized: operators write every
// element they size, and zeroing 4 MB per image showed in profiles.
template <typename T>
struct NoInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) {}
  template <typename U>
  void construct(U* p) {
    ::new (static_cast<void*>(p)) U;  // default-initialization: no zeroing
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using FloatBuffer = std::vector<float, NoInitAllocator<float>>;

// One sample of a batch.
struct Sample {
  DaliType type = DaliType::kUint8;
  Shape shape;
  std::string layout;  // "HWC", "CHW", ... or empty
  FloatBuffer values;
  // UINT8 values not held as floats (values is empty then): a request input, not copied (valid
  // while the request is), or a decoded image in `owned`, shared by the sample's copies.
  std::string_view bytes;
  bool is_view = false;
  std::shared_ptr<const std::vector<uint8_t>> owned;
  absl::Status error;  // a sample that failed keeps failing down the graph
  size_t NumElements() const { return is_view ? bytes.size() : values.size(); }
  float At(size_t i) const {
    return is_view ? static_cast<float>(static_cast<uint8_t>(bytes[i])) : values[i];
  }
};
using Batch = std::vector<Sample>;

struct RunContext {
  int threads = 1;
  int64_t max_pixels = int64_t{64} << 20;
  size_t batch_size = 0;  // samples in this run (for operators without inputs)
};

class Operator {
 public:
  virtual ~Operator() = default;
  // Computes the operator's output batch from its input batches (one per regular input, each
  // of ctx.batch_size samples). A sample-level failure is recorded in that sample's `error`;
  // a returned error fails the whole batch.
  virtual absl::Status Run(std::span<const Batch* const> inputs, Batch* output,
                           const RunContext& ctx) const = 0;

  // True when each output sample depends only on the same sample of the inputs: the executor
  // may then run a chain of such operators sample by sample (RunOneSample), one thread taking
  // a sample through the whole chain, instead of operator by operator.
  virtual bool PerSample() const { return false; }
  // One sample (inputs already checked for errors); never throws. Only when PerSample().
  virtual absl::Status RunOneSample(std::span<const Sample* const> /*in*/,
                                    const RunContext& /*ctx*/, Sample* /*out*/) const {
    return absl::UnimplementedError("not a per-sample operator");
  }
};

// Runs fn(0..n-1) on up to `threads` threads (this one included). fn must not throw.
void ParallelFor(size_t n, int threads, const std::function<void(size_t)>& fn);

// Builds the operator `node` names (ExternalSource excepted: the executor feeds it).
// UNIMPLEMENTED naming the operator and listing SupportedOperators() for one inferd does not
// run; INVALID_ARGUMENT naming the argument for a bad or unsupported argument.
absl::StatusOr<std::unique_ptr<Operator>> MakeOperator(const OpNode& node);

// The schema names inferd runs, for messages and docs.
std::span<const std::string_view> SupportedOperators();

// Stores v as `type` holds it: integer types round to nearest even and saturate.
float ConvertTo(DaliType type, float v);

}  // namespace inferd::backends::dali

namespace inferd::backends::dali {

// What an operator's output is, as far as it follows from its arguments and its inputs':
// type kNoType / ndim -1 where it does not. For auto-complete.
struct OutputMeta {
  DaliType type = DaliType::kNoType;
  int ndim = -1;
};
OutputMeta InferOutputMeta(const OpNode& node, std::span<const OutputMeta> inputs);

}  // namespace inferd::backends::dali
