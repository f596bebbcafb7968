// GPU metrics from NVML loaded with dlopen, against tests/fakes/fake_nvml.cc (two GPUs with fixed
// figures): the units (percent -> ratio, mW -> W, mJ -> J), the gpu_uuid labels, the HELP/TYPE
// lines as Triton's, a figure NVML does not support left out, and a library that is missing or
// whose nvmlInit fails giving a clear "unavailable" rather than an error.
#include "metrics/gpu_metrics.h"

#include <cstdlib>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kUuid0[] = "GPU-00000000-1111-2222-3333-444444444444";
constexpr char kUuid1[] = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
constexpr int kNoSamplingDuringTest = 3'600'000;  // ms: only the test's own Sample() calls

TEST(NvmlLibraryTest, ListsTheDevicesWithUuidAndName) {
  auto nvml = NvmlLibrary::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  const auto& d = (*nvml)->devices();
  ASSERT_EQ(d.size(), 2u);
  EXPECT_EQ(d[0].index, 0);
  EXPECT_EQ(d[0].uuid, kUuid0);
  EXPECT_EQ(d[0].name, "Fake A10G");
  EXPECT_EQ(d[1].index, 1);
  EXPECT_EQ(d[1].uuid, kUuid1);
  EXPECT_EQ(d[1].name, "Fake T4");
}

TEST(NvmlLibraryTest, ReadingsAreInTritonsUnits) {
  auto nvml = NvmlLibrary::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  NvmlReading r = (*nvml)->Read(0);
  ASSERT_TRUE(r.has_utilization && r.has_memory && r.has_power_usage && r.has_power_limit &&
              r.has_energy);
  EXPECT_DOUBLE_EQ(r.utilization, 0.37);                   // 37 %
  EXPECT_EQ(r.memory_total_bytes, 24ull << 30);
  EXPECT_EQ(r.memory_used_bytes, 1ull << 30);
  EXPECT_DOUBLE_EQ(r.power_usage_watts, 61.234);           // 61234 mW
  EXPECT_DOUBLE_EQ(r.power_limit_watts, 300.0);            // 300000 mW
  const uint64_t e0 = r.energy_millijoules;
  EXPECT_EQ((*nvml)->Read(0).energy_millijoules, e0 + 2500);

  NvmlReading t4 = (*nvml)->Read(1);
  EXPECT_DOUBLE_EQ(t4.utilization, 1.0);
  EXPECT_EQ(t4.memory_used_bytes, 512ull << 20);
  EXPECT_DOUBLE_EQ(t4.power_usage_watts, 70.0);
  EXPECT_FALSE(t4.has_power_limit);  // NVML_ERROR_NOT_SUPPORTED
}

TEST(NvmlLibraryTest, MissingLibraryIsUnavailableNamingIt) {
  auto nvml = NvmlLibrary::Open("/no/such/libnvidia-ml.so.1");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("cannot load /no/such/libnvidia-ml.so.1"));
}

TEST(NvmlLibraryTest, LibraryWithoutNvmlIsUnavailableNamingTheFunctions) {
  // libc is loadable but is no NVML.
  auto nvml = NvmlLibrary::Open("libc.so.6");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("lacks NVML function(s) nvmlInit_v2"));
}

TEST(NvmlLibraryTest, FailedInitIsUnavailableWithNvmlsError) {
  setenv("FAKE_NVML_INIT_ERROR", "9", 1);
  auto nvml = NvmlLibrary::Open(FAKE_NVML_PATH);
  unsetenv("FAKE_NVML_INIT_ERROR");
  ASSERT_FALSE(nvml.ok());
  EXPECT_EQ(nvml.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(nvml.status().message(), HasSubstr("NVML error 9: Driver Not Loaded"));
}

TEST(NvmlLibraryTest, DefaultPathIsTheDriversUnlessTheTestSeamIsSet) {
  unsetenv("INFERD_NVML_LIBRARY");
  EXPECT_EQ(NvmlLibrary::DefaultPath(), "libnvidia-ml.so.1");
  setenv("INFERD_NVML_LIBRARY", "/x/libfake.so", 1);
  EXPECT_EQ(NvmlLibrary::DefaultPath(), "/x/libfake.so");
  unsetenv("INFERD_NVML_LIBRARY");
}

TEST(GpuMetricsTest, RendersTheSixFamiliesAsTritonDoes) {
  auto nvml = NvmlLibrary::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  MetricsRegistry registry;
  GpuMetrics gpu(&registry, *std::move(nvml), kNoSamplingDuringTest);
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("# HELP nv_gpu_utilization GPU utilization rate [0.0 - 1.0)\n"
                              "# TYPE nv_gpu_utilization gauge\n"
                              "nv_gpu_utilization{gpu_uuid=\"" +
                              std::string(kUuid0) + "\"} 0.37\n"));
  EXPECT_THAT(text, HasSubstr("nv_gpu_utilization{gpu_uuid=\"" + std::string(kUuid1) + "\"} 1\n"));
  EXPECT_THAT(text, HasSubstr("# TYPE nv_gpu_memory_total_bytes gauge\n"));
  EXPECT_THAT(text, HasSubstr("nv_gpu_memory_total_bytes{gpu_uuid=\"" + std::string(kUuid0) +
                              "\"} 25769803776\n"));
  EXPECT_THAT(text, HasSubstr("nv_gpu_memory_used_bytes{gpu_uuid=\"" + std::string(kUuid1) +
                              "\"} 536870912\n"));
  EXPECT_THAT(text, HasSubstr("# HELP nv_gpu_power_usage GPU power usage in watts\n"));
  EXPECT_THAT(text, HasSubstr("nv_gpu_power_usage{gpu_uuid=\"" + std::string(kUuid0) +
                              "\"} 61.234\n"));
  EXPECT_THAT(text, HasSubstr("# HELP nv_gpu_power_limit GPU power management limit in watts\n"));
  EXPECT_THAT(text, HasSubstr("nv_gpu_power_limit{gpu_uuid=\"" + std::string(kUuid0) +
                              "\"} 300\n"));
  // The T4 gives no power limit: no sample for it, rather than a made-up 0.
  EXPECT_THAT(text, Not(HasSubstr("nv_gpu_power_limit{gpu_uuid=\"" + std::string(kUuid1))));
  EXPECT_THAT(text, HasSubstr("# TYPE nv_energy_consumption counter\n"));
  // The first reading is the counter's zero.
  EXPECT_THAT(text, HasSubstr("nv_energy_consumption{gpu_uuid=\"" + std::string(kUuid0) +
                              "\"} 0\n"));
}

TEST(GpuMetricsTest, EnergyCountsJoulesSinceStart) {
  auto nvml = NvmlLibrary::Open(FAKE_NVML_PATH);
  ASSERT_TRUE(nvml.ok()) << nvml.status();
  MetricsRegistry registry;
  GpuMetrics gpu(&registry, *std::move(nvml), kNoSamplingDuringTest);
  gpu.Sample();
  gpu.Sample();  // the fake's count grows 2500 mJ a reading: 5 J after two more samples
  const std::string text = registry.Render();
  EXPECT_THAT(text, HasSubstr("nv_energy_consumption{gpu_uuid=\"" + std::string(kUuid0) +
                              "\"} 5\n"));
  EXPECT_THAT(text, HasSubstr("nv_energy_consumption{gpu_uuid=\"" + std::string(kUuid1) +
                              "\"} 5\n"));
}

TEST(GpuMetricsTest, StartWithoutNvmlGivesNoMetricsAndNoError) {
  setenv("INFERD_NVML_LIBRARY", "/no/such/libnvidia-ml.so.1", 1);
  MetricsRegistry registry;
  EXPECT_EQ(StartGpuMetrics(&registry, 1000), nullptr);
  unsetenv("INFERD_NVML_LIBRARY");
  EXPECT_THAT(registry.Render(), Not(HasSubstr("nv_gpu")));
}

TEST(GpuMetricsTest, StartWithTheFakeSamplesOnItsThread) {
  setenv("INFERD_NVML_LIBRARY", FAKE_NVML_PATH, 1);
  MetricsRegistry registry;
  auto gpu = StartGpuMetrics(&registry, 1000);
  unsetenv("INFERD_NVML_LIBRARY");
  ASSERT_NE(gpu, nullptr);
  EXPECT_THAT(registry.Render(), HasSubstr("nv_gpu_utilization{gpu_uuid=\"" + std::string(kUuid0)));
  gpu.reset();  // the sampler thread stops and joins
}

}  // namespace
}  // namespace inferd::metrics
