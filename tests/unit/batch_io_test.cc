// The backend toolkit (backends/batch_io.h): gathering a batch's inputs into one tensor,
// slicing a batch output back to its requests, and the BYTES element helpers.
#include "backends/batch_io.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "gmock/gmock.h"
#include "gpu/copy.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"

namespace inferd::backends {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Fp32Bytes(std::vector<float> values) {
  std::string out(values.size() * 4, '\0');
  std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string BytesTensor(std::vector<std::string> elements) {
  std::string out;
  for (const auto& e : elements) AppendBytesElement(e, &out);
  return out;
}

// A request of `batch` rows whose tensors view strings it owns.
std::unique_ptr<core::InferRequest> MakeRequest(std::string id, int64_t batch) {
  auto r = std::make_unique<core::InferRequest>();
  r->id = std::move(id);
  r->batch_size = batch;
  return r;
}

void AddInput(core::InferRequest* r, std::string name, DataType type, Shape shape,
              std::string bytes) {
  r->owned.push_back(std::move(bytes));
  core::InputTensor t;
  t.name = std::move(name);
  t.datatype = type;
  t.shape = std::move(shape);
  t.data = r->owned.back();
  r->inputs.push_back(std::move(t));
}

core::RequestedOutput Wants(std::string name) {
  core::RequestedOutput o;
  o.name = std::move(name);
  return o;
}

inference::ModelInput InputConfig(std::string name) {
  inference::ModelInput cfg;
  cfg.set_name(std::move(name));
  return cfg;
}

// A batch: the requests and their responses, and the pointer spans Execute gets.
struct Batch {
  std::vector<std::unique_ptr<core::InferRequest>> owned_requests;
  std::vector<std::unique_ptr<core::InferResponse>> owned_responses;
  std::vector<core::InferRequest*> requests;
  std::vector<core::InferResponse*> responses;

  core::InferRequest* Add(std::unique_ptr<core::InferRequest> r) {
    requests.push_back(r.get());
    owned_requests.push_back(std::move(r));
    owned_responses.push_back(std::make_unique<core::InferResponse>());
    responses.push_back(owned_responses.back().get());
    return requests.back();
  }
};

// Requests of 1, 3 and 2 rows of FP32 [B, 2]: row k of the batch holds {k, k + 0.5}.
Batch ThreeFp32Requests() {
  Batch b;
  float next = 0;
  int n = 0;
  for (int64_t rows : {1, 3, 2}) {
    std::vector<float> v;
    for (int64_t i = 0; i < rows; ++i, ++next) {
      v.push_back(next);
      v.push_back(next + 0.5f);
    }
    std::string id = "r";
    id += std::to_string(n++);  // not "r" + ...: GCC 12 warns falsely (-Wrestrict)
    auto* r = b.Add(MakeRequest(std::move(id), rows));
    AddInput(r, "X", DataType::kFp32, {rows, 2}, Fp32Bytes(v));
  }
  return b;
}

std::vector<float> Floats(std::string_view bytes) {
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST(BatchInputCollectorTest, OneRequestUsesItsOwnBytes) {
  Batch b;
  auto* r = b.Add(MakeRequest("a", 2));
  AddInput(r, "X", DataType::kFp32, {2, 2}, Fp32Bytes({1, 2, 3, 4}));
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, /*batching=*/true, &buffers);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->data.data(), r->inputs[0].data.data());  // no copy
  EXPECT_THAT(batch->shape, ElementsAre(2, 2));
  EXPECT_EQ(batch->datatype, DataType::kFp32);
  EXPECT_TRUE(buffers.empty());
}

TEST(BatchInputCollectorTest, GathersRequestsOfDifferentBatchSizesInOrder) {
  Batch b = ThreeFp32Requests();
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, /*batching=*/true, &buffers);
  EXPECT_EQ(collector.total_batch(), 6);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(batch->shape, ElementsAre(6, 2));
  EXPECT_THAT(Floats(batch->data),
              ElementsAre(0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5));
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(batch->data.data(), buffers[0].Reserve(0));  // the instance's buffer
}

TEST(BatchInputCollectorTest, GathersTwoRequests) {
  for (int n : {2, 4}) {
    Batch b;
    std::vector<float> expected;
    for (int i = 0; i < n; ++i) {
      auto* r = b.Add(MakeRequest("", 1));
      AddInput(r, "X", DataType::kFp32, {1, 1}, Fp32Bytes({float(i)}));
      expected.push_back(float(i));
    }
    std::vector<BatchBuffer> buffers;
    BatchInputCollector collector(b.requests, true, &buffers);
    auto batch = collector.Gather(InputConfig("X"));
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_EQ(Floats(batch->data), expected) << n << " requests";
    EXPECT_THAT(batch->shape, ElementsAre(n, 1));
  }
}

TEST(BatchInputCollectorTest, GathersBytesElementsOfEveryRequest) {
  Batch b;
  auto* r0 = b.Add(MakeRequest("a", 1));
  AddInput(r0, "S", DataType::kBytes, {1, 2}, BytesTensor({"ab", ""}));
  auto* r1 = b.Add(MakeRequest("b", 2));
  AddInput(r1, "S", DataType::kBytes, {2, 2}, BytesTensor({"c", "dd", "eee", "f"}));
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  auto batch = collector.Gather(InputConfig("S"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->datatype, DataType::kBytes);
  EXPECT_THAT(batch->shape, ElementsAre(3, 2));
  std::vector<std::string> elements;
  ASSERT_TRUE(ForEachBytesElement(batch->data, [&](std::string_view e) {
                elements.emplace_back(e);
              }).ok());
  EXPECT_THAT(elements, ElementsAre("ab", "", "c", "dd", "eee", "f"));
}

TEST(BatchInputCollectorTest, AppliesReshapeKeepingTheBatchDimension) {
  Batch b = ThreeFp32Requests();
  inference::ModelInput cfg = InputConfig("X");
  cfg.mutable_reshape()->add_shape(1);
  cfg.mutable_reshape()->add_shape(2);
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  auto batch = collector.Gather(cfg);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_THAT(batch->shape, ElementsAre(6, 1, 2));
}

TEST(BatchInputCollectorTest, RequestWhoseBytesDisagreeWithItsShapeIsNamed) {
  Batch b = ThreeFp32Requests();
  // The second request claims [3, 2] FP32 (24 bytes) but holds 20.
  b.requests[1]->owned.back().resize(20);
  b.requests[1]->inputs[0].data = b.requests[1]->owned.back();
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(batch.status().message(), HasSubstr("input 'X'"));
  EXPECT_THAT(batch.status().message(), HasSubstr("request 'r1' (2 of 3)"));
  EXPECT_THAT(batch.status().message(), HasSubstr("needs 24 bytes, but holds 20"));
}

TEST(BatchInputCollectorTest, OneRequestWhoseBytesDisagreeIsRefused) {
  Batch b;
  auto* r = b.Add(MakeRequest("a", 1));
  AddInput(r, "X", DataType::kFp32, {1, 2}, Fp32Bytes({1}));
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(BatchInputCollectorTest, BytesElementCountMustMatchTheShape) {
  Batch b;
  auto* r0 = b.Add(MakeRequest("a", 1));
  AddInput(r0, "S", DataType::kBytes, {1, 2}, BytesTensor({"x", "y"}));
  auto* r1 = b.Add(MakeRequest("b", 1));
  AddInput(r1, "S", DataType::kBytes, {1, 2}, BytesTensor({"x"}));
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  auto batch = collector.Gather(InputConfig("S"));
  ASSERT_FALSE(batch.ok());
  EXPECT_THAT(batch.status().message(), HasSubstr("holds 1 BYTES elements"));
}

TEST(BatchInputCollectorTest, MissingAndMismatchedInputs) {
  Batch b = ThreeFp32Requests();
  std::vector<BatchBuffer> buffers;
  {
    BatchInputCollector collector(b.requests, true, &buffers);
    EXPECT_EQ(collector.Gather(InputConfig("Y")).status().code(), absl::StatusCode::kNotFound);
  }
  AddInput(b.requests[0], "Y", DataType::kFp32, {1, 1}, Fp32Bytes({1}));
  {
    BatchInputCollector collector(b.requests, true, &buffers);
    auto batch = collector.Gather(InputConfig("Y"));
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(batch.status().message(), HasSubstr("left out by request 'r1'"));
  }
  b.requests[2]->inputs[0].shape = {1, 4};  // 2 rows' bytes, but other item dims
  b.requests[2]->batch_size = 1;
  {
    BatchInputCollector collector(b.requests, true, &buffers);
    auto batch = collector.Gather(InputConfig("X"));
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(batch.status().message(), HasSubstr("does not batch with"));
  }
}

TEST(BatchInputCollectorTest, ReusesItsBufferForABatchOfTheSameSize) {
  std::vector<BatchBuffer> buffers;
  const char* first_data = nullptr;
  for (int round = 0; round < 3; ++round) {
    Batch b = ThreeFp32Requests();
    BatchInputCollector collector(b.requests, true, &buffers);
    auto batch = collector.Gather(InputConfig("X"));
    ASSERT_TRUE(batch.ok()) << batch.status();
    if (round == 0) first_data = batch->data.data();
    EXPECT_EQ(batch->data.data(), first_data) << "round " << round;
    EXPECT_THAT(Floats(batch->data),
                ElementsAre(0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5));
  }
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_EQ(buffers[0].allocations(), 1);
}

TEST(BatchInputCollectorTest, EachInputGetsItsOwnBuffer) {
  Batch b = ThreeFp32Requests();
  for (auto* r : b.requests) {
    AddInput(r, "Z", DataType::kInt32, {r->batch_size}, std::string(4 * r->batch_size, '\7'));
  }
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  auto x = collector.Gather(InputConfig("X"));
  auto z = collector.Gather(InputConfig("Z"));
  ASSERT_TRUE(x.ok() && z.ok());
  EXPECT_EQ(buffers.size(), 2u);
  EXPECT_NE(x->data.data(), z->data.data());
  EXPECT_THAT(Floats(x->data), ElementsAre(0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5));
  EXPECT_EQ(z->data, std::string(24, '\7'));
}

TEST(BatchBufferTest, GrowsOnlyForALargerSize) {
  BatchBuffer buffer;
  char* a = buffer.Reserve(64);
  EXPECT_EQ(buffer.Reserve(64), a);
  EXPECT_EQ(buffer.Reserve(8), a);
  EXPECT_EQ(buffer.allocations(), 1);
  buffer.Reserve(65);
  EXPECT_EQ(buffer.allocations(), 2);
  EXPECT_EQ(buffer.capacity(), 65u);
}

// A stand-in for a runtime's pinned allocator: heap blocks it remembers, so a test can tell
// its memory from the collector's own; `fail` makes it answer as an exhausted allocator does.
struct RecordingAllocator {
  std::vector<std::pair<const char*, size_t>> blocks;
  bool fail = false;
  BatchBuffer::Allocator Get() {
    return [this](size_t bytes) -> BatchBuffer::Block {
      if (fail) return {};
      auto owner = std::shared_ptr<char[]>(new char[bytes]);
      blocks.push_back({owner.get(), bytes});
      return {owner.get(), owner};
    };
  }
  bool Owns(const char* p) const {
    for (const auto& [b, n] : blocks) {
      if (p >= b && p < b + n) return true;
    }
    return false;
  }
};

constexpr MemoryPlacement kPinned{MemoryPlacement::Kind::kPinnedHost, 0};

TEST(BatchInputCollectorTest, PinnedDestinationCopiesALoneRequestIntoPinnedMemory) {
  Batch b;
  auto* r = b.Add(MakeRequest("a", 2));
  AddInput(r, "X", DataType::kFp32, {2, 2}, Fp32Bytes({1, 2, 3, 4}));
  RecordingAllocator pinned;
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, /*batching=*/true, &buffers, pinned.Get());
  auto batch = collector.Gather(InputConfig("X"), kPinned);
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_NE(batch->data.data(), r->inputs[0].data.data());  // copied, not viewed
  EXPECT_TRUE(pinned.Owns(batch->data.data()));
  EXPECT_THAT(Floats(batch->data), ElementsAre(1, 2, 3, 4));
  EXPECT_THAT(batch->shape, ElementsAre(2, 2));
  ASSERT_EQ(buffers.size(), 1u);
  EXPECT_TRUE(buffers[0].allocator_backed());
}

TEST(BatchInputCollectorTest, PinnedDestinationGathersABatchAndReusesItsBlock) {
  RecordingAllocator pinned;
  std::vector<BatchBuffer> buffers(1);  // a heap buffer an earlier host gather left
  for (int round = 0; round < 3; ++round) {
    Batch b = ThreeFp32Requests();
    BatchInputCollector collector(b.requests, true, &buffers, pinned.Get());
    auto batch = collector.Gather(InputConfig("X"), kPinned);
    ASSERT_TRUE(batch.ok()) << batch.status();
    EXPECT_TRUE(pinned.Owns(batch->data.data())) << "round " << round;
    EXPECT_THAT(Floats(batch->data),
                ElementsAre(0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5));
  }
  EXPECT_EQ(pinned.blocks.size(), 1u);  // one block, kept across batches
  EXPECT_EQ(buffers[0].allocations(), 1);
}

TEST(BatchInputCollectorTest, PinnedDestinationSaysWhenItCannotAllocate) {
  Batch b = ThreeFp32Requests();
  RecordingAllocator pinned;
  pinned.fail = true;
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers, pinned.Get());
  auto batch = collector.Gather(InputConfig("X"), kPinned);
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(batch.status().message(),
              HasSubstr("input 'X': cannot allocate 48 bytes of pinned host memory"));
  // Without an allocator the caller is wrong, not the client.
  BatchInputCollector without(b.requests, true, &buffers);
  EXPECT_EQ(without.Gather(InputConfig("X"), kPinned).status().code(),
            absl::StatusCode::kInternal);
}

// The batch output of ThreeFp32Requests' batch: [6, 2] FP32, row k = {10k, 10k + 1}.
std::string BatchOutput() {
  std::vector<float> v;
  for (int k = 0; k < 6; ++k) {
    v.push_back(10.f * k);
    v.push_back(10.f * k + 1);
  }
  return Fp32Bytes(v);
}

TEST(BatchOutputResponderTest, SlicesByEachRequestsBatchSize) {
  Batch b = ThreeFp32Requests();
  auto out = std::make_shared<std::string>(BatchOutput());
  BatchOutputResponder responder(b.requests, b.responses, true);
  ASSERT_TRUE(responder.Respond(nullptr, "Y", DataType::kFp32, {6, 2}, *out, out).ok());
  ASSERT_EQ(b.responses[0]->outputs.size(), 1u);
  const auto& o0 = b.responses[0]->outputs[0];
  EXPECT_EQ(o0.name, "Y");
  EXPECT_THAT(o0.shape, ElementsAre(1, 2));
  EXPECT_THAT(Floats(o0.data), ElementsAre(0, 1));
  EXPECT_EQ(o0.holder, out);
  EXPECT_THAT(b.responses[1]->outputs[0].shape, ElementsAre(3, 2));
  EXPECT_THAT(Floats(b.responses[1]->outputs[0].data), ElementsAre(10, 11, 20, 21, 30, 31));
  EXPECT_THAT(b.responses[2]->outputs[0].shape, ElementsAre(2, 2));
  EXPECT_THAT(Floats(b.responses[2]->outputs[0].data), ElementsAre(40, 41, 50, 51));
  // Views of the one buffer, not copies.
  EXPECT_EQ(b.responses[2]->outputs[0].data.data(), out->data() + 32);
}

TEST(BatchOutputResponderTest, GpuSourceSlicesCarryTheGpuPlace) {
  Batch b = ThreeFp32Requests();
  auto out = std::make_shared<std::string>(BatchOutput());  // stands for GPU 1's memory
  BatchOutputResponder responder(b.requests, b.responses, true);
  ASSERT_TRUE(responder
                  .Respond(nullptr, "Y", DataType::kFp32, {6, 2}, *out, out,
                           {MemoryPlacement::Kind::kGpu, 1})
                  .ok());
  for (const auto* r : b.responses) EXPECT_EQ(r->outputs.at(0).place, MemoryPlace::Gpu(1));
  EXPECT_EQ(b.responses[2]->outputs[0].data.data(), out->data() + 32);
  // Host sources stay host.
  Batch h = ThreeFp32Requests();
  BatchOutputResponder host(h.requests, h.responses, true);
  ASSERT_TRUE(host.Respond(nullptr, "Y", DataType::kFp32, {6, 2}, *out, out).ok());
  EXPECT_EQ(h.responses[0]->outputs.at(0).place, MemoryPlace::Host());
  // BYTES on a GPU cannot be split (its lengths are in the bytes).
  Batch y = ThreeFp32Requests();
  BatchOutputResponder bytes(y.requests, y.responses, true);
  auto st = bytes.Respond(nullptr, "S", DataType::kBytes, {6}, *out, out,
                          {MemoryPlacement::Kind::kGpu, 0});
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("output 'S'"));
}

TEST(BatchOutputResponderTest, OnlyRequestsThatAskedGetAnOutput) {
  Batch b = ThreeFp32Requests();
  b.requests[0]->outputs.push_back(Wants("Y"));
  b.requests[1]->outputs.push_back(Wants("OTHER"));
  // requests[2] names none: every output.
  auto out = std::make_shared<std::string>(BatchOutput());
  BatchOutputResponder responder(b.requests, b.responses, true);
  EXPECT_TRUE(responder.AnyRequested("Y"));
  EXPECT_TRUE(responder.AnyRequested("OTHER"));
  ASSERT_TRUE(responder.Respond(nullptr, "Y", DataType::kFp32, {6, 2}, *out, out).ok());
  EXPECT_EQ(b.responses[0]->outputs.size(), 1u);
  EXPECT_TRUE(b.responses[1]->outputs.empty());
  ASSERT_EQ(b.responses[2]->outputs.size(), 1u);
  // The skipped request's rows are still skipped over.
  EXPECT_THAT(Floats(b.responses[2]->outputs[0].data), ElementsAre(40, 41, 50, 51));

  b.requests[2]->outputs.push_back(Wants("OTHER"));
  BatchOutputResponder filtered(b.requests, b.responses, true);
  EXPECT_FALSE(filtered.AnyRequested("NOBODY"));
}

TEST(BatchOutputResponderTest, OneRequestGetsTheWholeOutputAndItsReshape) {
  Batch b;
  auto* r = b.Add(MakeRequest("a", 2));
  AddInput(r, "X", DataType::kFp32, {2, 2}, Fp32Bytes({1, 2, 3, 4}));
  auto out = std::make_shared<std::string>(Fp32Bytes({1, 2, 3, 4}));
  inference::ModelOutput cfg;
  cfg.set_name("Y");
  cfg.add_dims(2);
  cfg.mutable_reshape()->add_shape(2);  // the runtime's [2, 2] is the client's [2, 2]...
  BatchOutputResponder responder(b.requests, b.responses, true);
  // ...where the runtime gives [2, 1, 2].
  ASSERT_TRUE(responder.Respond(&cfg, "Y", DataType::kFp32, {2, 1, 2}, *out, out).ok());
  ASSERT_EQ(b.responses[0]->outputs.size(), 1u);
  EXPECT_THAT(b.responses[0]->outputs[0].shape, ElementsAre(2, 2));
  EXPECT_EQ(b.responses[0]->outputs[0].data.data(), out->data());
}

TEST(BatchOutputResponderTest, SplitsBytesAtElementBoundaries) {
  Batch b;
  b.Add(MakeRequest("a", 1));
  b.Add(MakeRequest("b", 2));
  auto out = std::make_shared<std::string>(BytesTensor({"x", "yy", "", "zzz"}));
  BatchOutputResponder responder(b.requests, b.responses, true);
  // 4 elements cannot be 3 rows of one.
  auto st = responder.Respond(nullptr, "S", DataType::kBytes, {3}, *out, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("4 BYTES elements"));
  EXPECT_TRUE(b.responses[0]->outputs.empty());
  auto two_per_row = std::make_shared<std::string>(BytesTensor({"a", "bb", "c", "", "ddd", "e"}));
  ASSERT_TRUE(
      responder.Respond(nullptr, "S", DataType::kBytes, {3, 2}, *two_per_row, two_per_row).ok());
  EXPECT_EQ(b.responses[0]->outputs[0].data, BytesTensor({"a", "bb"}));
  EXPECT_THAT(b.responses[0]->outputs[0].shape, ElementsAre(1, 2));
  EXPECT_EQ(b.responses[1]->outputs[0].data, BytesTensor({"c", "", "ddd", "e"}));
  EXPECT_THAT(b.responses[1]->outputs[0].shape, ElementsAre(2, 2));
}

TEST(BatchOutputResponderTest, OutputThatDoesNotSplitByBatchIsAnError) {
  Batch b = ThreeFp32Requests();
  auto out = std::make_shared<std::string>(BatchOutput());
  BatchOutputResponder responder(b.requests, b.responses, true);
  auto st = responder.Respond(nullptr, "Y", DataType::kFp32, {12}, *out, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("output 'Y' cannot be split by batch"));
  st = responder.Respond(nullptr, "Y", DataType::kFp32, {6, 3}, *out, out);
  EXPECT_EQ(st.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(st.message(), HasSubstr("48 bytes of FP32"));
  for (auto* r : b.responses) EXPECT_TRUE(r->outputs.empty());
}

TEST(BytesElementsTest, CountAndOffsets) {
  const std::string buffer = BytesTensor({"ab", "", "cde"});
  EXPECT_EQ(*CountBytesElements(buffer), 3u);
  EXPECT_THAT(*BytesElementOffsets(buffer), ElementsAre(0, 6, 10, 17));
  EXPECT_EQ(*CountBytesElements(""), 0u);
  EXPECT_FALSE(CountBytesElements(buffer.substr(0, 5)).ok());
  EXPECT_FALSE(BytesElementOffsets(std::string("\1\0", 2)).ok());
}

// ---- Inputs on a GPU (TakeGpuInputs), on the fake device layer ----

// Moves request `r`'s input 0 into fake GPU `device` memory (kept by the request).
void MoveToGpu(gpu::FakeRuntime& rt, core::InferRequest* r, int device) {
  core::InputTensor& t = r->inputs[0];
  auto placed = gpu::CopyToPlaceNow(&rt, t.data, t.place, MemoryPlace::Gpu(device));
  ASSERT_TRUE(placed.ok()) << placed.status();
  auto owned = std::make_shared<gpu::PlacedBuffer>(*std::move(placed));
  t.data = owned->view();
  t.place = MemoryPlace::Gpu(device);
  r->holders.push_back(std::move(owned));
}

struct GpuGather {
  explicit GpuGather(int device) : rt(gpu::FakeRuntime::WithDevices(2)), device(device) {
    stream = *rt->CreateStream(device);
  }
  void Take(BatchInputCollector& c) {
    c.TakeGpuInputs(
        device, &device_buffers,
        [this](size_t bytes) -> BatchBuffer::Block {
          auto m = rt->AllocateDevice(this->device, bytes);
          if (!m.ok()) return {};
          char* data = static_cast<char*>((*m)->data());
          return {data, std::shared_ptr<gpu::DeviceBuffer>(*std::move(m))};
        },
        [this](void* dst, const void* src, MemoryPlace place, size_t bytes) {
          return gpu::CopyBetween(*rt, dst, MemoryPlace::Gpu(this->device), src, place, bytes,
                                  stream.get());
        });
  }
  std::unique_ptr<gpu::FakeRuntime> rt;
  int device;
  std::unique_ptr<gpu::Stream> stream;
  std::vector<BatchBuffer> device_buffers;
};

TEST(BatchInputCollectorGpuTest, LoneRequestOnTheGpuIsBoundWhereItIs) {
  GpuGather g(1);
  Batch b;
  auto* r = b.Add(MakeRequest("a", 2));
  AddInput(r, "X", DataType::kFp32, {2, 2}, Fp32Bytes({1, 2, 3, 4}));
  MoveToGpu(*g.rt, r, 1);
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  g.Take(collector);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->place, MemoryPlace::Gpu(1));
  EXPECT_EQ(batch->data.data(), r->inputs[0].data.data());  // no copy
  EXPECT_EQ(g.rt->CopyCount(gpu::CopyKind::kDeviceToDevice), 0);
  EXPECT_TRUE(g.device_buffers.empty());
}

TEST(BatchInputCollectorGpuTest, MixedBatchIsGatheredOnTheGpuOneCopyPerRequest) {
  GpuGather g(0);
  Batch b = ThreeFp32Requests();
  MoveToGpu(*g.rt, b.requests[0], 0);
  MoveToGpu(*g.rt, b.requests[2], 0);
  const int h2d_before = g.rt->CopyCount(gpu::CopyKind::kHostToDevice);
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  g.Take(collector);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->place, MemoryPlace::Gpu(0));
  EXPECT_THAT(batch->shape, ElementsAre(6, 2));
  EXPECT_EQ(g.rt->CopyCount(gpu::CopyKind::kDeviceToDevice), 2);
  EXPECT_EQ(g.rt->CopyCount(gpu::CopyKind::kHostToDevice) - h2d_before, 1);
  EXPECT_THAT(Floats(batch->data), ElementsAre(0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 4.5, 5, 5.5));
  EXPECT_TRUE(buffers.empty());  // the host buffers are not used
  ASSERT_EQ(g.device_buffers.size(), 1u);
}

TEST(BatchInputCollectorGpuTest, HostOnlyBatchIsGatheredOnTheHostAsBefore) {
  GpuGather g(0);
  Batch b = ThreeFp32Requests();
  std::vector<BatchBuffer> buffers;
  BatchInputCollector collector(b.requests, true, &buffers);
  g.Take(collector);
  auto batch = collector.Gather(InputConfig("X"));
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ(batch->place, MemoryPlace::Host());
  EXPECT_EQ(buffers.size(), 1u);
  EXPECT_TRUE(g.device_buffers.empty());
}

TEST(BatchInputCollectorGpuTest, TensorOnAGpuTheInstanceDoesNotReadIsRefused) {
  GpuGather g(0);
  Batch b;
  auto* r = b.Add(MakeRequest("a", 1));
  AddInput(r, "X", DataType::kFp32, {1, 2}, Fp32Bytes({1, 2}));
  MoveToGpu(*g.rt, r, 1);
  std::vector<BatchBuffer> buffers;
  BatchInputCollector host_only(b.requests, true, &buffers);
  auto batch = host_only.Gather(InputConfig("X"));
  EXPECT_EQ(batch.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(batch.status().message(), HasSubstr("input 'X' of request 'a' (1 of 1) is on GPU 1"));
  BatchInputCollector other_gpu(b.requests, true, &buffers);
  g.Take(other_gpu);
  EXPECT_EQ(other_gpu.Gather(InputConfig("X")).status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace inferd::backends
