#include "repository/placement.h"

#include <google/protobuf/text_format.h>

#include <cstdlib>

#include "backends/onnxruntime/onnxruntime_backend.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"

namespace inferd::repository {
namespace {

using ::testing::HasSubstr;

const absl::Status kGpuOk = absl::OkStatus();
const absl::Status kCpuOnly = absl::FailedPreconditionError("backend 'identity' runs only on the CPU");

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
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU count: 2 } ]"), kGpuOk, host.options);
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
      kGpuOk, host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  // The KIND_CPU group sets no count: Triton's two for onnxruntime.
  EXPECT_THAT(Describe(*p),
              ::testing::ElementsAre("m_0_0@cpu", "m_0_1@cpu", "g_0@gpu:3", "g_0@gpu:1"));
}

TEST(PlacementTest, GpuIdOutOfRangeIsRefusedNamingIt) {
  Host host(2);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU gpus: [ 0, 2 ] } ]"),
                          kGpuOk, host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            "instance group m_0 of model m specifies invalid or unsupported gpu id 2. GPUs with "
            "at least the minimum required CUDA compute compatibility of 6.0 are: 0, 1");
}

TEST(PlacementTest, MinComputeCapabilityExcludesOldGpus) {
  Host host(1, 7, 5);  // a T4
  host.options.min_compute_capability = 8.0;
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), kGpuOk,
                          host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("no GPU has compute capability 8.0 or more"));
  EXPECT_THAT(p.status().message(), HasSubstr("GPU 0 'Fake GPU 0' is 7.5"));
  p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]"), kGpuOk, host.options);
  EXPECT_FALSE(p.ok());
  host.options.min_compute_capability = 7.5;  // equal is enough
  p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), kGpuOk,
                     host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@gpu:0"));
}

TEST(PlacementTest, KindAutoPicksTheGpuWhenOneExistsAndTheBackendCanUseIt) {
  const config::ModelConfig cfg = Config("instance_group [ { kind: KIND_AUTO count: 2 } ]");
  Host gpu_host(1);
  auto p = PlaceInstances(cfg, kGpuOk, gpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@gpu:0", "m_0_1@gpu:0"));
  p = PlaceInstances(cfg, kCpuOnly, gpu_host.options);  // CPU-only backend
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu", "m_0_1@cpu"));
  Host cpu_host(0);
  p = PlaceInstances(cfg, kGpuOk, cpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu", "m_0_1@cpu"));
}

// Triton's NormalizeInstanceGroup: no instance_group is one KIND_AUTO group named after the
// model, and a group without a count gets SetDefaultInstanceCount's: 2 on the CPU for
// onnxruntime and tensorflow, 1 for other backends and 1 per GPU.
TEST(PlacementTest, NoInstanceGroupAndNoCountAreTritonsDefaults) {
  Host gpu_host(2);
  Host cpu_host(0);
  const config::ModelConfig none = Config("");
  ASSERT_EQ(none.instance_group_size(), 1);
  EXPECT_EQ(none.instance_group(0).name(), "m");
  EXPECT_EQ(none.instance_group(0).kind(), inference::ModelInstanceGroup::KIND_AUTO);
  auto p = PlaceInstances(none, kGpuOk, gpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0@gpu:0", "m_0@gpu:1"));
  p = PlaceInstances(none, kGpuOk, cpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0@cpu", "m_1@cpu"));
  p = PlaceInstances(none, kCpuOnly, gpu_host.options);  // a backend that cannot use the GPU
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0@cpu", "m_1@cpu"));

  // Resolved into the config the client reads back; the placement does not change.
  config::ModelConfig resolved = none;
  ResolveInstanceGroups(&resolved, kGpuOk, cpu_host.options);
  EXPECT_EQ(resolved.instance_group(0).kind(), inference::ModelInstanceGroup::KIND_CPU);
  EXPECT_EQ(resolved.instance_group(0).count(), 2);
  p = PlaceInstances(resolved, kGpuOk, cpu_host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0@cpu", "m_1@cpu"));
  resolved = none;
  ResolveInstanceGroups(&resolved, kGpuOk, gpu_host.options);
  EXPECT_EQ(resolved.instance_group(0).kind(), inference::ModelInstanceGroup::KIND_GPU);
  EXPECT_EQ(resolved.instance_group(0).count(), 1);

  // Other backends: one instance; a count below 1 is unset too (Triton's `count < 1`).
  config::ModelConfig torch;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "name: \"m\" backend: \"pytorch\" instance_group [ { kind: KIND_CPU count: -2 } ]", &torch));
  ASSERT_TRUE(config::NormalizeAndValidate(&torch, "m").ok());
  ResolveInstanceGroups(&torch, kGpuOk, cpu_host.options);
  EXPECT_EQ(torch.instance_group(0).count(), 1);
  // An explicit count stays.
  config::ModelConfig three = Config("instance_group [ { kind: KIND_CPU count: 3 } ]");
  ResolveInstanceGroups(&three, kGpuOk, cpu_host.options);
  EXPECT_EQ(three.instance_group(0).count(), 3);
  EXPECT_EQ(DefaultInstanceCount(false, "tensorflow"), 2);
  EXPECT_EQ(DefaultInstanceCount(false, "python"), 1);
  EXPECT_EQ(DefaultInstanceCount(true, "onnxruntime"), 1);
}

TEST(PlacementTest, KindCpuWithGpusIsRefused) {
  Host host(1);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]"),
                          kGpuOk, host.options);
  EXPECT_EQ(p.status().message(),
            "instance group m_0 of model m has kind KIND_CPU but specifies one or more GPUs");
}

TEST(PlacementTest, NoGpuFailsSayingWhyOrFallsBackWithOneWarning) {
  gpu::FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  PlacementOptions options;
  options.gpus = &none;
  const config::ModelConfig cfg =
      Config("instance_group [ { kind: KIND_GPU gpus: [ 0, 1 ] }, { kind: KIND_GPU count: 2 } ]");
  auto p = PlaceInstances(cfg, kGpuOk, options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(p.status().message(),
            "instance group m_0 of model m has kind KIND_GPU but cannot run on a GPU: no NVIDIA "
            "driver on this host: CUDA error 35. Use KIND_CPU or KIND_AUTO, or start inferd with "
            "--gpu-fallback-to-cpu to run KIND_GPU instances on the CPU");
  options.gpu_fallback_to_cpu = true;
  p = PlaceInstances(cfg, kGpuOk, options);
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
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), kCpuOnly,
                          host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("backend 'identity' runs only on the CPU"));
  host.options.gpu_fallback_to_cpu = true;
  p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), kCpuOnly,
                     host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu"));
}

TEST(PlacementTest, NullRuntimeMeansNoGpu) {
  PlacementOptions options;  // gpus null: a caller that gave none (tools)
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), kGpuOk,
                          options);
  EXPECT_THAT(p.status().message(), HasSubstr("this server has no GPU runtime"));
}

// Without ONNX Runtime's CUDA execution provider (CI: INFERD_FETCH_ORT_CUDA unset), the
// onnxruntime backend says why it cannot take a GPU instance, and placement passes that on.
TEST(PlacementTest, OnnxRuntimeWithoutTheCudaProviderSaysWhy) {
  setenv("INFERD_ORT_CUDA_EP_LIBRARY", "/nonexistent/libonnxruntime_providers_cuda.so", 1);
  auto backend = backends::MakeOnnxRuntimeBackend();
  const absl::Status support = backend->GpuInstanceSupport();
  unsetenv("INFERD_ORT_CUDA_EP_LIBRARY");
  EXPECT_EQ(support.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(support.message(), HasSubstr("CUDA execution provider is not installed"));
  EXPECT_THAT(support.message(), HasSubstr("/nonexistent/libonnxruntime_providers_cuda.so"));
  EXPECT_THAT(support.message(), HasSubstr("INFERD_FETCH_ORT_CUDA=1"));
  Host host(1);
  auto p = PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), support, host.options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(), HasSubstr("CUDA execution provider is not installed"));
  // KIND_AUTO then stays on the CPU.
  p = PlaceInstances(Config("instance_group [ { kind: KIND_AUTO count: 1 } ]"), support,
                     host.options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(Describe(*p), ::testing::ElementsAre("m_0_0@cpu"));
  // A GPU instance handed to it anyway is refused with the same reason, not crashed on.
  config::ModelConfig cfg = Config("instance_group [ { kind: KIND_GPU } ]");
  backends::ModelSpec spec;
  spec.config = &cfg;
  setenv("INFERD_ORT_CUDA_EP_LIBRARY", "/nonexistent/libonnxruntime_providers_cuda.so", 1);
  auto inst = backend->CreateInstanceOn(spec, cfg.instance_group(0), 0, {true, 0, "m_0_0"});
  unsetenv("INFERD_ORT_CUDA_EP_LIBRARY");
  EXPECT_EQ(inst.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(inst.status().message(),
              HasSubstr("model 'm': instance 'm_0_0' on GPU 0: backend 'onnxruntime' cannot run"));
}

// With the provider installed (INFERD_ORT_CUDA_EP_LIBRARY set by whoever runs it; CI does not),
// a GPU instance registers it once and binds to the device, or says why it cannot: here, with
// no driver, the provider loads (against the stub libcuda) and lists no GPU.
TEST(PlacementTest, OnnxRuntimeRegistersTheCudaProviderWhenInstalled) {
  const char* lib = std::getenv("INFERD_ORT_CUDA_EP_LIBRARY");
  if (lib == nullptr || *lib == 0) GTEST_SKIP() << "INFERD_ORT_CUDA_EP_LIBRARY is not set";
  auto backend = backends::MakeOnnxRuntimeBackend();
  ASSERT_TRUE(backend->GpuInstanceSupport().ok()) << backend->GpuInstanceSupport();
  config::ModelConfig cfg = Config("instance_group [ { kind: KIND_GPU } ]");
  backends::ModelSpec spec;
  spec.config = &cfg;
  spec.model_path = "/nonexistent/model.onnx";
  auto inst = backend->CreateInstanceOn(spec, cfg.instance_group(0), 0, {true, 0, "m_0_0"});
  ASSERT_FALSE(inst.ok());  // no model file in either case
  RecordProperty("answer", std::string(inst.status().message()));
  if (gpu::SystemRuntime().DeviceCount() == 0) {
    EXPECT_THAT(inst.status().message(), ::testing::AnyOf(HasSubstr("lists no GPU"),
                                                          HasSubstr("cannot load ONNX Runtime")))
        << inst.status();
  } else {
    EXPECT_THAT(inst.status().message(), HasSubstr("failed to load")) << inst.status();
  }
}

}  // namespace
}  // namespace inferd::repository
