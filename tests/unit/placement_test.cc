#include "repository/placement.h"

#include <google/protobuf/text_format.h>

#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"

namespace inferd::repository {
namespace {

using ::testing::HasSubstr;

config::ModelConfig Config(const std::string& groups) {
  config::ModelConfig cfg;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "name: \"m\" backend: \"onnxruntime\" " + groups, &cfg));
  EXPECT_TRUE(config::NormalizeAndValidate(&cfg, "m").ok());
  return cfg;
}

// "name@gpu:id" / "name@cpu" per instance, in creation order.
std::vector<std::string> Describe(const Placement& p) {
  std::vector<std::string> out;
  for (const auto& i : p.instances) {
    out.push_back(i.device.name + (i.device.gpu ? "@gpu:" + std::to_string(i.device.id) : "@cpu"));
  }
  return out;
}

struct Host {
  std::unique_ptr<gpu::FakeRuntime> rt;
  PlacementOptions options;
  explicit Host(int gpus, int major = 8, int minor = 6) : rt(gpu::FakeRuntime::WithDevices(gpus, major, minor)) {
    options.gpus = rt.get();
  }
};

TEST(PlacementTest, KindGpuWithoutGpusTakesEveryGpuCountPerGpu) {
  Host host(2);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU count: 2 } ]"), "onnxruntime",
                          true, host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  // Triton's order and names: n outer, GPU inner; the same name on each GPU.
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@gpu:0", "m_0_0@gpu:1", "m_0_1@gpu:0",
                                                   "m_0_1@gpu:1"));
  EXPECT_EQ(p->fallback_warning, "");
}

TEST(PlacementTest, ListedGpusOnly) {
  Host host(4);
  auto p = PlaceInstances(
      Config("instance_group [ { kind: KIND_CPU }, { name: \"g\" kind: KIND_GPU gpus: [ 3, 1 ] } ]"),
      "onnxruntime", true, host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu", "g_0@gpu:3", "g_0@gpu:1"));
}

TEST(PlacementTest, GpuIdOutOfRangeIsRefusedNamingIt) {
  Host host(2);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU gpus: [ 0, 2 ] } ]"),
                          "onnxruntime", true, host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "instance group m_0 of model m specifies invalid or unsupported gpu id 2. GPUs with "
            "at least the minimum required CUDA compute compatibility of 6.0 are: 0, 1");
}

TEST(PlacementTest, MinComputeCapabilityExcludesOldGpus) {
  Host host(1, 7, 5);  // a T4
  host.options.min_compute_capability = 8.0;
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), "onnxruntime", true,
                          host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("no GPU has compute capability 8.0 or more"));
  EXPECT_THAT(p.status().message(), HasSubstr("GPU 0 'Fake GPU 0' is 7.5"));
  p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"), "onnxruntime",
                     true, host.options);
  EXPECT_FALSE(p.ok());
  host.options.min_compute_capability = 7.5;  // equal is enough
  p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), "onnxruntime", true,
                     host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@gpu:0"));
}

TEST(PlacementTest, KindAutoPicksTheGpuWhenOneExistsAndTheBackendCanUseIt) {
  const config::ModelConfig cfg = Config("instance_group [ { kind: KIND_AUTO count: 2 } ]");
  Host gpu_host(1);
  auto p = PlaceInstances(cfg, "onnxruntime", true, gpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@gpu:0", "m_0_1@gpu:0"));
  p = PlaceInstances(cfg, "identity", false, gpu_host.options);  // CPU-only backend
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu", "m_0_1@cpu"));
  Host cpu_host(0);
  p = PlaceInstances(cfg, "onnxruntime", true, cpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu", "m_0_1@cpu"));
  // No instance_group at all is one KIND_CPU instance (config normalization), as before.
  p = PlaceInstances(Config(""), "onnxruntime", true, gpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu"));
}

TEST(PlacementTest, KindCpuWithGpusIsRefused) {
  Host host(1);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]"),
                          "onnxruntime", true, host.options);
  EXPECT_EQ(p.status().message(),
            "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs");
}

TEST(PlacementTest, NoGpuFailsSayingWhyOrFallsBackWithOneWarning) {
  gpu::FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  PlacementOptions options;
  options.gpus = &none;
  const config::ModelConfig cfg =
      Config("instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] }, { kind: KIND_GPU count: 2 } ]");
  auto p = PlaceInstances(cfg, "onnxruntime", true, options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            "instance group m_0 of model m has kind KIND_GPU but cannot run on a GPU: no NVIDIA "
            "driver on this host: CUDA error 35. Use KIND_CPU or KIND_AUTO, or start inferd with "
            "--gpu-fallback-to-cpu to run KIND_GPU instances on the CPU");
  options.gpu_fallback_to_cpu = true;
  p = PlaceInstances(cfg, "onnxruntime", true, options);
  ASSERT_TRUE(p.ok()) << p.status();
  // As many instances as the GPUs would have had.
  EXPECT_THAT(Describe(*p),
              ::testing::ElementsAre("m_0_0@cpu", "m_0_0@cpu", "m_1_0@cpu", "m_1_1@cpu"));
  EXPECT_EQ(p->fallback_warning,
            "model 'm': instance group(s) m_0, m_1 ask for KIND_GPU, which cannot run here (no "
            "NVIDIA driver on this host: CUDA error 35); running them on the CPU "
            "(--gpu-fallback-to-cpu)");
}

TEST(PlacementTest, CpuOnlyBackendRefusesKindGpuOnAGpuHost) {
  Host host(1);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), "identity", false,
                          host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("backend 'identity' runs only on the CPU"));
  host.options.gpu_fallback_to_cpu = true;
  p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), "identity", false,
                     host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu"));
}

TEST(PlacementTest, NullRuntimeMeansNoGpu) {
  PlacementOptions options;  // gpus null: a caller that gave none (tools)
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), "onnxruntime", true,
                          options);
  EXPECT_THAT(p.status().message(), HasSubstr("this server has no GPU runtime"));
}

}  // namespace
}  // namespace inferd::repository
