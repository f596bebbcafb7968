#include <new>
#include <stdexcept>
#include <vector>

#include "backends/backend.h"
#include "gtest/gtest.h"

namespace inferd::backends {
namespace {

TEST(FailBatchOnExceptionTest, AnEscapingExceptionFailsEveryResponse) {
  core::InferResponse a, b;
  a.outputs.emplace_back();
  std::vector<core::InferResponse*> responses = {&a, &b};
  FailBatchOnException("x backend", responses, [] { throw std::runtime_error("boom"); });
  for (auto* r : responses) {
    EXPECT_EQ(r->status.code(), absl::StatusCode::kInternal);
    EXPECT_EQ(r->status.message(), "x backend: boom");
    EXPECT_TRUE(r->outputs.empty());
  }
}

TEST(FailBatchOnExceptionTest, OutOfMemoryIsResourceExhausted) {
  core::InferResponse a;
  std::vector<core::InferResponse*> responses = {&a};
  FailBatchOnException("x backend", responses, [] { throw std::bad_alloc(); });
  EXPECT_EQ(a.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(a.status.message(), "x backend: out of memory");
}

TEST(FailBatchOnExceptionTest, NoExceptionLeavesTheResponsesAsRunSetThem) {
  core::InferResponse a;
  std::vector<core::InferResponse*> responses = {&a};
  bool ran = false;
  FailBatchOnException("x backend", responses, [&] { ran = true; });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(a.status.ok());
}

}  // namespace
}  // namespace inferd::backends
