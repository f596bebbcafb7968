#include "server/request_validation.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::server {
namespace {

using ::testing::HasSubstr;

config::ModelConfig SimpleConfig() {
  auto cfg = config::ParseModelConfigText(R"(
name: "simple" backend: "identity" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ -1 ] optional: true } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] } ]
)", "c");
  return *cfg;
}

core::InferRequest Request(Shape shape, size_t bytes, DataType type = DataType::kInt32) {
  core::InferRequest req;
  req.owned.emplace_back(bytes, '\0');
  req.inputs.push_back({"INPUT0", type, std::move(shape), req.owned.back()});
  return req;
}

TEST(RequestValidationTest, AcceptsAndSetsBatchSize) {
  auto req = Request({3, 16}, 3 * 16 * 4);
  ASSERT_TRUE(ValidateRequest(SimpleConfig(), &req).ok());
  EXPECT_EQ(req.batch_size, 3);
}

TEST(RequestValidationTest, RejectsWithClearMessages) {
  const auto cfg = SimpleConfig();
  {
    auto req = Request({1, 15}, 15 * 4);
    auto st = ValidateRequest(cfg, &req);
    EXPECT_THAT(st.message(), HasSubstr("input 'INPUT0' has shape [1,15] but model 'simple' expects [-1,16]"));
  }
  {
    auto req = Request({9, 16}, 9 * 16 * 4);
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("batch size 9"));
  }
  {
    auto req = Request({1, 16}, 16 * 4, DataType::kFp32);
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("has datatype FP32 but model 'simple' expects INT32"));
  }
  {
    auto req = Request({1, 16}, 10);
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("needs 64 bytes, but 10 bytes were sent"));
  }
  {
    auto req = Request({1, 16}, 64);
    req.inputs.push_back({"NOPE", DataType::kInt32, {1}, "abcd"});
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("unexpected inference input 'NOPE'"));
  }
  {
    core::InferRequest req;
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("expects input 'INPUT0'"));
  }
  {
    auto req = Request({1, 16}, 64);
    req.outputs.push_back({"OUT", false, 0});
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("unexpected inference output 'OUT'"));
  }
  {
    auto req = Request({1, 16}, 64);
    req.inputs.push_back(req.inputs[0]);
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("more than once"));
  }
  {
    auto req = Request({1, 16}, 64);
    req.inputs.push_back({"INPUT1", DataType::kInt32, {2, 1}, std::string_view(req.owned.front()).substr(0, 8)});
    EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("different batch sizes"));
  }
}

TEST(RequestValidationTest, BytesElementsAreCounted) {
  auto cfg = *config::ParseModelConfigText(
      "name: \"s\" backend: \"identity\" input [{name: \"x\" data_type: TYPE_STRING dims: [2]}] "
      "output [{name: \"y\" data_type: TYPE_STRING dims: [2]}]", "c");
  core::InferRequest req;
  req.owned.emplace_back(std::string("\x01\x00\x00\x00" "a", 5));
  req.inputs.push_back({"x", DataType::kBytes, {2}, req.owned.back()});
  EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("1 BYTES elements were sent"));
  req.owned.emplace_back(std::string("\x09\x00\x00\x00" "a", 5));
  req.inputs[0].data = req.owned.back();
  EXPECT_THAT(ValidateRequest(cfg, &req).message(), HasSubstr("claims 9 bytes"));
}

}  // namespace
}  // namespace inferd::server
