// GPU memory in the model store, with fake GPUs (gpu::FakeRuntime) and a backend whose GPU
// instances allocate fake device memory: the device memory a version takes is measured per GPU
// at load (or taken from the backend's own report), --model-load-gpu-limit refuses a load on a
// GPU past its limit, and evicts only idle models holding memory on THAT GPU to make room.
// Also the budget's side alone (MemoryBudget::DeviceVictim) and the statistics' memory_usage
// entries, as the HTTP frontend writes them.
#include <google/protobuf/text_format.h>

#include <filesystem>
#include <fstream>
#include <memory>

#include "backends/backend.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gtest/gtest.h"
#include "repository/memory_budget.h"
#include "repository/model_lifecycle.h"

namespace inferd::repository {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr int64_t kMiB = 1 << 20;

// An instance holding `bytes` of fake device memory on its GPU; it reports them only when asked
// to (`report`), so the store's measurement is what the other tests see.
class FakeGpuInstance : public backends::ModelInstance {
 public:
  FakeGpuInstance(std::unique_ptr<gpu::DeviceBuffer> memory, int64_t reported)
      : memory_(std::move(memory)), reported_(reported) {}
  void Execute(std::span<core::InferRequest* const>, std::span<core::InferResponse* const>,
               backends::ExecutionTimes*) override {}
  int64_t DeviceMemoryBytes() const override { return reported_; }

 private:
  std::unique_ptr<gpu::DeviceBuffer> memory_;
  const int64_t reported_;
};

std::string Param(const config::ModelConfig& cfg, const std::string& key) {
  auto it = cfg.parameters().find(key);
  return it == cfg.parameters().end() ? std::string() : it->second.string_value();
}

// parameters: gpu_mib (allocated per GPU instance), report_mib (what DeviceMemoryBytes says;
// absent: -1, unknown).
class FakeGpuBackend : public backends::Backend {
 public:
  explicit FakeGpuBackend(gpu::FakeRuntime* rt) : rt_(rt) {}
  std::string_view name() const override { return "fakegpu"; }
  absl::Status GpuInstanceSupport() const override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstance(
      const backends::ModelSpec& spec, const inference::ModelInstanceGroup& group,
      int index) override {
    return std::make_unique<FakeGpuInstance>(nullptr, -1);
  }
  absl::StatusOr<std::unique_ptr<backends::ModelInstance>> CreateInstanceOn(
      const backends::ModelSpec& spec, const inference::ModelInstanceGroup& group, int index,
      const backends::InstanceDevice& device) override {
    if (!device.gpu) return CreateInstance(spec, group, index);
    const std::string mib = Param(*spec.config, "gpu_mib");
    const std::string report = Param(*spec.config, "report_mib");
    auto memory = rt_->AllocateDevice(device.id, std::stoll(mib.empty() ? "0" : mib) * kMiB);
    if (!memory.ok()) return memory.status();
    return std::make_unique<FakeGpuInstance>(*std::move(memory),
                                             report.empty() ? -1 : std::stoll(report) * kMiB);
  }

 private:
  gpu::FakeRuntime* const rt_;
};

class GpuMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("inferd_gpu_memory_test_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_ / "repo");
    rt_ = gpu::FakeRuntime::WithDevices(2, 8, 6, /*memory_bytes=*/1024 * kMiB);
    backends_.Register(std::make_unique<FakeGpuBackend>(rt_.get()));
  }
  void TearDown() override {
    store_.reset();
    fs::remove_all(root_);
  }

  // A model folder <root>/<where>/<name> with version 1 and instances on `gpus`.
  std::string AddModel(const std::string& where, const std::string& name, const std::string& gpus,
                       int64_t gpu_mib, int64_t report_mib = -1) {
    const fs::path dir = root_ / where / name;
    fs::create_directories(dir / "1");
    std::ofstream(dir / "1" / "model.bin") << "x";
    std::ofstream cfg(dir / "config.pbtxt");
    cfg << "name: \"" << name << "\"\nbackend: \"fakegpu\"\nmax_batch_size: 0\n"
        << "input [ { name: \"IN\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
        << "output [ { name: \"OUT\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
        << "instance_group [ { kind: KIND_GPU gpus: [ " << gpus << " ] } ]\n"
        << "parameters { key: \"gpu_mib\" value: { string_value: \"" << gpu_mib << "\" } }\n";
    if (report_mib >= 0) {
      cfg << "parameters { key: \"report_mib\" value: { string_value: \"" << report_mib
          << "\" } }\n";
    }
    return dir.string();
  }

  void Start(std::map<int, double> limits = {}) {
    LifecycleOptions o;
    o.repositories = {(root_ / "repo").string()};
    o.load.placement.gpus = rt_.get();
    o.gpu_load_limits = std::move(limits);
    store_ = std::make_unique<ModelLifecycle>(o, &backends_);
    ASSERT_TRUE(store_->Open().ok());
  }

  std::map<int, int64_t> GpuBytes(const std::string& name) {
    auto m = store_->Get(name, -1);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? (*m)->gpu_memory_bytes() : std::map<int, int64_t>{};
  }

  uint64_t Used(int device) {
    auto info = rt_->GetMemoryInfo(device);
    return info->total_bytes - info->free_bytes;
  }

  fs::path root_;
  std::unique_ptr<gpu::FakeRuntime> rt_;
  backends::BackendRegistry backends_;
  std::unique_ptr<ModelLifecycle> store_;
};

TEST_F(GpuMemoryTest, EachGpuGetsTheMemoryTheInstancesTookThere) {
  AddModel("repo", "a", "0, 1", 64);
  AddModel("repo", "b", "1", 100);
  Start();
  ASSERT_TRUE(store_->Load("a").ok());
  ASSERT_TRUE(store_->Load("b").ok());
  EXPECT_THAT(GpuBytes("a"), UnorderedElementsAre(Pair(0, 64 * kMiB), Pair(1, 64 * kMiB)));
  EXPECT_THAT(GpuBytes("b"), UnorderedElementsAre(Pair(1, 100 * kMiB)));
  // Unload gives it back (the fake frees with the instances).
  ASSERT_TRUE(store_->Unload("b").ok());
  EXPECT_EQ(Used(1), static_cast<uint64_t>(64 * kMiB));
}

TEST_F(GpuMemoryTest, ConcurrentLoadsOnOneGpuDoNotTakeEachOthersMemory) {
  const std::vector<std::string> names = {"m1", "m2", "m3", "m4", "m5", "m6"};
  for (size_t i = 0; i < names.size(); ++i) AddModel("repo", names[i], "0", 10 * (i + 1));
  Start();
  ASSERT_TRUE(store_->LoadAll().ok());  // in parallel on the loader pool
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_THAT(GpuBytes(names[i]), UnorderedElementsAre(Pair(0, 10 * (i + 1) * kMiB)))
        << names[i];
  }
}

TEST_F(GpuMemoryTest, TheBackendsOwnReportWins) {
  AddModel("repo", "a", "0", 64, /*report_mib=*/50);
  Start();
  ASSERT_TRUE(store_->Load("a").ok());
  EXPECT_THAT(GpuBytes("a"), UnorderedElementsAre(Pair(0, 50 * kMiB)));
}

TEST_F(GpuMemoryTest, LimitRefusesALoadOnAGpuAlreadyAboveIt) {
  AddModel("repo", "a", "0", 64);
  AddModel("repo", "b", "1", 64);
  Start({{0, 0.5}});
  // Something else (another process) holds 600 MiB of GPU 0's 1024.
  auto other = rt_->AllocateDevice(0, 600 * kMiB);
  ASSERT_TRUE(other.ok());
  absl::Status st = store_->Load("a");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("cannot load on GPU 0"));
  EXPECT_THAT(st.message(), HasSubstr("600 MiB"));
  EXPECT_THAT(st.message(), HasSubstr("--model-load-gpu-limit 0:0.5"));
  EXPECT_EQ(Used(0), static_cast<uint64_t>(600 * kMiB));  // no instance was created
  // GPU 1 has no limit.
  EXPECT_TRUE(store_->Load("b").ok());
  // Below the limit again, it loads.
  other->reset();
  EXPECT_TRUE(store_->Load("a").ok());
}

TEST_F(GpuMemoryTest, LimitCountsWhatTheModelTookThereLastTime) {
  AddModel("repo", "a", "0", 300);
  Start({{0, 0.5}});
  ASSERT_TRUE(store_->Load("a").ok());  // 0 used: under 512 MiB
  ASSERT_TRUE(store_->Unload("a").ok());
  auto other = rt_->AllocateDevice(0, 300 * kMiB);
  ASSERT_TRUE(other.ok());
  // 300 used is under the limit, but a's 300 MiB would take it to 600: refused before any
  // instance is created (Triton's check of the usage alone would let it load past the limit).
  absl::Status st = store_->Load("a");
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("300 MiB + 300 MiB this model took there before"));
  EXPECT_EQ(Used(0), static_cast<uint64_t>(300 * kMiB));
}

TEST_F(GpuMemoryTest, LimitEvictsOnlyIdleModelsOnThatGpu) {
  // Evictable models (loaded from a URL, as SageMaker's multi-model API does).
  const std::string on0 = AddModel("urls", "on0", "0", 300);
  const std::string on1 = AddModel("urls", "on1", "1", 300);
  const std::string busy0 = AddModel("urls", "busy0", "0", 200);
  const std::string next0 = AddModel("urls", "next0", "0", 100);
  Start({{0, 0.5}, {1, 0.5}});
  ASSERT_TRUE(store_->LoadFromUrl("on1", on1).ok());
  ASSERT_TRUE(store_->LoadFromUrl("busy0", busy0).ok());
  ASSERT_TRUE(store_->LoadFromUrl("on0", on0).ok());
  // GPU 0 holds 500 of 1024 MiB; another process takes 100 more: 600 > 512. busy0 is in use,
  // on1 holds memory on GPU 1 only: on0 is the one to go.
  auto other = rt_->AllocateDevice(0, 100 * kMiB);
  ASSERT_TRUE(other.ok());
  auto held = store_->Get("busy0", -1);
  ASSERT_TRUE(held.ok());
  ASSERT_TRUE(store_->LoadFromUrl("next0", next0).ok());
  EXPECT_FALSE(store_->Get("on0", -1).ok());
  EXPECT_TRUE(store_->Get("on1", -1).ok()) << "a model on GPU 1 was evicted for GPU 0";
  EXPECT_TRUE(store_->Get("busy0", -1).ok()) << "a model in use was evicted";
  EXPECT_EQ(Used(0), static_cast<uint64_t>((200 + 100 + 100) * kMiB));
  EXPECT_EQ(Used(1), static_cast<uint64_t>(300 * kMiB));
}

TEST_F(GpuMemoryTest, LimitFailsNamingTheGpuWhenNothingThereCanGo) {
  const std::string big = AddModel("urls", "big", "0", 600);
  const std::string small = AddModel("urls", "small", "0", 10);
  const std::string on1 = AddModel("urls", "on1", "1", 600);
  Start({{0, 0.5}});
  ASSERT_TRUE(store_->LoadFromUrl("big", big).ok());
  ASSERT_TRUE(store_->LoadFromUrl("on1", on1).ok());
  auto held = store_->Get("big", -1);  // in use
  ASSERT_TRUE(held.ok());
  absl::Status st = store_->LoadFromUrl("small", small);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted) << st;
  EXPECT_THAT(st.message(), HasSubstr("GPU 0"));
  EXPECT_THAT(st.message(), HasSubstr("big 600 MiB (in use)"));
  EXPECT_THAT(st.message(), Not(HasSubstr("on1")));
  EXPECT_TRUE(store_->Get("on1", -1).ok());
}

// ---- the budget's side alone ----

struct Recorder : EvictionPolicy {
  std::string_view name() const override { return "recorder"; }
  void OnLoaded(const std::string& m, int64_t bytes, double) override { loaded.push_back(m); }
  void OnUsed(const std::string&) override {}
  void OnUsedBatch(const std::vector<RequestCount>&) override {}
  void OnUnloaded(const std::string&) override {}
  absl::StatusOr<std::vector<std::string>> ChooseVictims(
      int64_t, int64_t, int64_t, const std::function<bool(const std::string&)>& ok) override {
    for (const auto& m : loaded) {
      if (ok(m)) return std::vector<std::string>{m};
    }
    return absl::ResourceExhaustedError("none");
  }
  std::vector<std::string> loaded;
};

TEST(MemoryBudgetDevicesTest, VictimHoldsMemoryOnThatGpuAndIsIdle) {
  MemoryBudget budget(0, std::make_unique<Recorder>(), absl::Seconds(1));
  for (const char* m : {"g1", "g0busy", "g0", "cpu"}) budget.OnLoaded(m, 1, 1);
  budget.SettleDevices("g1", {{1, 100}});
  budget.SettleDevices("g0busy", {{0, 100}});
  budget.SettleDevices("g0", {{0, 100}});
  budget.SettleDevices("cpu", {});
  MemoryBudget::Models models;
  models.evictable = {"g1", "g0busy", "g0", "cpu"};
  models.idle = {"g1", "g0", "cpu"};
  models.why = {{"g0busy", "in use"}, {"g0", "idle"}};
  EXPECT_EQ(budget.DeviceVictim("new", 0, models), "g0");
  EXPECT_EQ(budget.DeviceVictim("g0", 0, models), "");  // never the model being loaded
  EXPECT_EQ(budget.DeviceVictim("new", 1, models), "g1");
  EXPECT_EQ(budget.DeviceHolders(0, models), "g0 0 MiB (idle), g0busy 0 MiB (in use)");
  budget.Retire("g0", {});
  EXPECT_EQ(budget.DeviceVictim("new", 0, models), "");
  EXPECT_EQ(budget.device_bytes("g0", 0), 0);
  EXPECT_EQ(budget.device_bytes("g1", 1), 100);
}

}  // namespace
}  // namespace inferd::repository
