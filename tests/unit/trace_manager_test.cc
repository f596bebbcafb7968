// server::TraceManager: how global and per-model trace settings combine (tritonserver's
// rules), sampling by rate and count, refused updates, and what reaches the trace file.
#include "server/trace.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace inferd::server {
namespace {

using Settings = std::map<std::string, TraceSettingValue>;

TraceSettingValue V(std::string v) { return {false, {std::move(v)}}; }
TraceSettingValue Null() { return {true, {}}; }

std::string Field(const TraceManager& m, const std::string& model, const std::string& key) {
  for (const auto& [k, v] : m.Describe(model)) {
    if (k == key) return v.empty() ? "" : v[0];
  }
  return "<missing>";
}

std::string TempFile(const char* tag) {
  return ::testing::TempDir() + "/trace_" + tag + "_" + std::to_string(::getpid()) + ".json";
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TraceManagerTest, ModelSettingsOverrideFieldsAndFollowTheGlobalInTheRest) {
  TraceOptions o;
  o.file = TempFile("override");
  TraceManager m(o);
  ASSERT_TRUE(m.Update("", {{"trace_rate", V("50")}}).ok());
  ASSERT_TRUE(m.Update("a", {{"trace_level", {false, {"TIMESTAMPS"}}}}).ok());
  EXPECT_EQ(Field(m, "a", "trace_level"), "TIMESTAMPS");
  EXPECT_EQ(Field(m, "a", "trace_rate"), "50");  // from the global setting
  EXPECT_EQ(Field(m, "", "trace_level"), "OFF");
  EXPECT_EQ(Field(m, "b", "trace_level"), "OFF");  // no setting of its own: the global one
  // A later global change reaches the fields the model did not set.
  ASSERT_TRUE(m.Update("", {{"trace_rate", V("7")}, {"log_frequency", V("3")}}).ok());
  EXPECT_EQ(Field(m, "a", "trace_rate"), "7");
  EXPECT_EQ(Field(m, "a", "log_frequency"), "3");
  EXPECT_EQ(Field(m, "a", "trace_level"), "TIMESTAMPS");
  // null hands a field back; with every field handed back the model follows the global one.
  ASSERT_TRUE(m.Update("a", {{"trace_level", Null()}}).ok());
  EXPECT_EQ(Field(m, "a", "trace_level"), "OFF");
  ASSERT_TRUE(m.Update("", {{"trace_level", {false, {"TIMESTAMPS"}}}}).ok());
  EXPECT_EQ(Field(m, "a", "trace_level"), "TIMESTAMPS");
  // Clearing the global setting's field goes back to the start-up value.
  ASSERT_TRUE(m.Update("", {{"trace_rate", Null()}}).ok());
  EXPECT_EQ(Field(m, "", "trace_rate"), "1000");
}

TEST(TraceManagerTest, SamplesEveryRateThRequestUntilTheCountIsUsed) {
  TraceOptions o;
  o.file = TempFile("count");
  o.level = kTraceTimestamps;
  o.rate = 3;
  o.count = 2;
  TraceManager m(o);
  std::vector<int> sampled;
  std::vector<std::unique_ptr<core::RequestTrace>> keep;
  for (int i = 1; i <= 12; ++i) {
    auto t = m.Sample("m", 1, "r" + std::to_string(i));
    if (t != nullptr) {
      sampled.push_back(i);
      keep.push_back(std::move(t));
    }
  }
  EXPECT_EQ(sampled, (std::vector<int>{3, 6}));
  EXPECT_EQ(Field(m, "", "trace_count"), "0");
  // A model with its own setting has its own counters.
  ASSERT_TRUE(m.Update("other", {{"trace_rate", V("1")}, {"trace_count", V("1")}}).ok());
  EXPECT_NE(m.Sample("other", 1, ""), nullptr);
  EXPECT_EQ(m.Sample("other", 1, ""), nullptr);
  EXPECT_EQ(m.Sample("m", 1, ""), nullptr);
}

TEST(TraceManagerTest, RefusedUpdatesChangeNothing) {
  TraceManager no_file{TraceOptions{}};
  EXPECT_EQ(no_file.Update("", {{"trace_level", {false, {"TIMESTAMPS"}}}}).code(),
            absl::StatusCode::kInvalidArgument);  // no trace file
  TraceOptions o;
  o.file = TempFile("refused");
  TraceManager m(o);
  EXPECT_EQ(m.Update("", {{"trace_file", V("/tmp/x")}}).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(m.Update("", {{"trace_level", {false, {"TENSORS"}}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Update("", {{"trace_level", {false, {"OFF", "TIMESTAMPS"}}}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Update("", {{"trace_rate", V("9"), }, {"trace_count", V("-2")}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Update("", {{"trace_rate", V("4294967296")}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Update("", {{"trace_level", {false, {"TIMESTAMPS"}}}, {"trace_rate", V("0")}}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Update("", {{"sampling", V("1")}}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Field(m, "", "trace_rate"), "1000");
  EXPECT_EQ(Field(m, "", "trace_level"), "OFF");
  EXPECT_TRUE(TraceManager::Validate(o).ok());
  o.level = kTraceTensors;
  EXPECT_FALSE(TraceManager::Validate(o).ok());
}

TEST(TraceManagerTest, WritesTimestampsInOrderToIndexedFiles) {
  TraceOptions o;
  o.file = TempFile("files");
  o.level = kTraceTimestamps;
  o.rate = 1;
  o.log_frequency = 2;
  std::remove((o.file + ".0").c_str());
  {
    TraceManager m(o);
    for (int i = 0; i < 2; ++i) {
      core::InferRequest r;
      r.times = {100, 200, 300, 400, 500, 600};
      r.trace = m.Sample("m\"q", 3, "id" + std::to_string(i));
      ASSERT_NE(r.trace, nullptr);
    }  // each request, destroyed, writes its trace
  }
  const std::string text = Read(o.file + ".0");
  EXPECT_EQ(text.front(), '[');
  EXPECT_EQ(text.back(), ']');
  EXPECT_NE(text.find("\"model_name\":\"m\\\"q\",\"model_version\":3,\"request_id\":\"id0\""),
            std::string::npos) << text;
  size_t pos = 0;
  for (const char* stage : {"REQUEST_START\",\"ns\":100", "QUEUE_START\",\"ns\":200",
                            "COMPUTE_START\",\"ns\":300", "COMPUTE_INPUT_END\",\"ns\":400",
                            "COMPUTE_OUTPUT_START\",\"ns\":500", "COMPUTE_END\",\"ns\":600",
                            "REQUEST_END"}) {
    pos = text.find(stage, pos);
    ASSERT_NE(pos, std::string::npos) << stage << " in " << text;
  }
  std::remove((o.file + ".0").c_str());
}

}  // namespace
}  // namespace inferd::server
