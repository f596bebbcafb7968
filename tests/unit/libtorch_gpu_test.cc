// The PyTorch backend's answer to GPU instances (issue 29) where LibTorch has no CUDA: Debian's
// CPU LibTorch here and in CI. The backend's source is linked in (not the dlopen'ed module), so
// this is the same code the module runs; on the GPU machine the module built against a CUDA
// LibTorch runs GPU instances (tests/gpu/test_gpu_instances.py).
#include <google/protobuf/text_format.h>

#include "backends/libtorch/libtorch_backend.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"
#include "repository/placement.h"

namespace inferd::backends {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

config::ModelConfig Config(const std::string& groups) {
  config::ModelConfig cfg;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(
      "name: \"m\" platform: \"pytorch_libtorch\" " + groups, &cfg));
  EXPECT_TRUE(config::NormalizeAndValidate(&cfg, "m").ok());
  return cfg;
}

TEST(LibTorchGpuTest, WithoutCudaGpuInstancesAreRefusedSayingWhy) {
  auto backend = MakeLibTorchBackend();
  const absl::Status support = backend->GpuInstanceSupport();
  if (support.ok()) GTEST_SKIP() << "this LibTorch has CUDA and sees a GPU";
  EXPECT_EQ(support.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(support.message(), HasSubstr("backend 'pytorch' cannot run on a GPU: LibTorch "));
  EXPECT_THAT(support.message(),
              AnyOf(HasSubstr("is a CPU build (torch::cuda::is_available() is false"),
                    HasSubstr("has CUDA but finds no GPU")));

  // Placement passes the reason on where the host has a GPU (a fake one here): KIND_GPU fails
  // the load naming it, KIND_AUTO stays on the CPU, --gpu-fallback-to-cpu runs it there.
  auto gpus = gpu::FakeRuntime::WithDevices(1, 9, 0);
  repository::PlacementOptions options;
  options.gpus = gpus.get();
  auto p = repository::PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), support,
                                      options);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(p.status().message(),
              HasSubstr("has kind KIND_GPU but cannot run on a GPU: backend 'pytorch' cannot run "
                        "on a GPU: LibTorch"));
  p = repository::PlaceInstances(Config("instance_group [ { kind: KIND_AUTO } ]"), support,
                                 options);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->instances.size(), 1u);
  EXPECT_FALSE(p->instances[0].device.gpu);
  options.gpu_fallback_to_cpu = true;
  p = repository::PlaceInstances(Config("instance_group [ { kind: KIND_GPU } ]"), support,
                                 options);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_THAT(p->fallback_warning, HasSubstr("backend 'pytorch' cannot run on a GPU"));

  // A GPU instance handed to it anyway is refused with the same reason, before any file is
  // read, not crashed on.
  config::ModelConfig cfg = Config("instance_group [ { kind: KIND_GPU } ]");
  ModelSpec spec;
  spec.config = &cfg;
  spec.model_path = "/nonexistent/model.pt";
  auto inst = backend->CreateInstanceOn(spec, cfg.instance_group(0), 0, {true, 0, "m_0_0"});
  EXPECT_EQ(inst.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(inst.status().message(),
              HasSubstr("model 'm': instance 'm_0_0' on GPU 0: backend 'pytorch' cannot run on a "
                        "GPU: LibTorch"));
}

}  // namespace
}  // namespace inferd::backends
