// The request parameters both protocols share (core/request_parameters.h): one set of rules,
// each protocol's own words for a type.
#include "core/request_parameters.h"

#include "gtest/gtest.h"

namespace inferd::core {
namespace {

ParameterValue Uint(uint64_t v) {
  ParameterValue p;
  p.kind = ParameterValue::Kind::kUint64;
  p.uint64 = v;
  return p;
}
ParameterValue Int(int64_t v) {
  ParameterValue p;
  p.kind = ParameterValue::Kind::kInt64;
  p.int64 = v;
  return p;
}
ParameterValue Str(std::string_view v) {
  ParameterValue p;
  p.kind = ParameterValue::Kind::kString;
  p.text = v;
  return p;
}
ParameterValue Bool(bool v) {
  ParameterValue p;
  p.kind = ParameterValue::Kind::kBool;
  p.boolean = v;
  return p;
}

TEST(RequestParametersTest, TheServersOwnParametersAreApplied) {
  InferRequest r;
  EXPECT_TRUE(*ApplyRequestParameter("priority", Int(2), kGrpcParameterWords, &r));
  EXPECT_TRUE(*ApplyRequestParameter("timeout", Uint(5000), kJsonParameterWords, &r));
  EXPECT_TRUE(*ApplyRequestParameter("sequence_id", Str("abc"), kJsonParameterWords, &r));
  EXPECT_TRUE(*ApplyRequestParameter("sequence_start", Bool(true), kJsonParameterWords, &r));
  EXPECT_TRUE(*ApplyRequestParameter("binary_data_output", Bool(true), kJsonParameterWords, &r));
  EXPECT_FALSE(*ApplyRequestParameter("top_k", Int(3), kJsonParameterWords, &r));
  EXPECT_EQ(r.priority, 2u);
  EXPECT_EQ(r.timeout_us, 5000u);
  EXPECT_TRUE(r.sequence_id.is_string);
  EXPECT_EQ(r.sequence_id.text, "abc");
  EXPECT_TRUE(r.sequence_start);
  EXPECT_FALSE(r.sequence_end);
}

TEST(RequestParametersTest, WrongTypesAreRefusedInTheProtocolsWords) {
  InferRequest r;
  EXPECT_EQ(ApplyRequestParameter("sequence_end", Str("yes"), kJsonParameterWords, &r).status(),
            absl::InvalidArgumentError("parameter 'sequence_end' must be a boolean"));
  EXPECT_EQ(ApplyRequestParameter("sequence_end", Str("yes"), kGrpcParameterWords, &r).status(),
            absl::InvalidArgumentError("parameter 'sequence_end' must be a bool_param"));
  EXPECT_EQ(ApplyRequestParameter("sequence_id", Int(-3), kJsonParameterWords, &r).status(),
            absl::InvalidArgumentError(
                "parameter 'sequence_id' must be a non-negative integer or a string"));
  EXPECT_EQ(ApplyRequestParameter("timeout", Int(-1), kGrpcParameterWords, &r).status(),
            absl::InvalidArgumentError(
                "parameter 'timeout' must be a non-negative integer (microseconds)"));
}

TEST(RequestParametersTest, APriorityAbove32BitsIsRefusedNotTruncated) {
  // gRPC's int64/uint64 priority used to be cut to 32 bits (2^32 + 1 became priority 1).
  InferRequest r;
  EXPECT_EQ(ApplyRequestParameter("priority", Uint((uint64_t{1} << 32) + 1), kGrpcParameterWords,
                                  &r)
                .status(),
            absl::InvalidArgumentError("parameter 'priority' must be a non-negative integer"));
  EXPECT_EQ(r.priority, 0u);
}

TEST(RequestParametersTest, SharedMemoryParameters) {
  ParameterValue region = Str("r0"), offset = Uint(16), size = Uint(64);
  auto ref = ParseSharedMemoryParameters(&region, &offset, &size, kJsonParameterWords, "input 'x'");
  ASSERT_TRUE(ref.ok() && ref->has_value());
  EXPECT_EQ((*ref)->region, "r0");
  EXPECT_EQ((*ref)->offset, 16u);
  EXPECT_EQ((*ref)->byte_size, 64u);
  EXPECT_FALSE(
      ParseSharedMemoryParameters(nullptr, nullptr, nullptr, kJsonParameterWords, "x")->has_value());
  EXPECT_EQ(ParseSharedMemoryParameters(nullptr, &offset, nullptr, kJsonParameterWords, "input 'x'")
                .status()
                .message(),
            "input 'x': 'shared_memory_offset' and 'shared_memory_byte_size' need "
            "'shared_memory_region'");
  ParameterValue bad = Int(-1);
  EXPECT_EQ(ParseSharedMemoryParameters(&region, &bad, &size, kGrpcParameterWords, "output 'y'")
                .status()
                .message(),
            "output 'y': 'shared_memory_offset' must be a non-negative int64_param");
  EXPECT_EQ(ParseSharedMemoryParameters(&size, nullptr, &size, kJsonParameterWords, "input 'x'")
                .status()
                .message(),
            "input 'x': 'shared_memory_region' must be a string");
  EXPECT_EQ(ParseSharedMemoryParameters(&region, nullptr, nullptr, kJsonParameterWords, "input 'x'")
                .status()
                .message(),
            "input 'x': 'shared_memory_byte_size' must be given with 'shared_memory_region'");
}

}  // namespace
}  // namespace inferd::core
