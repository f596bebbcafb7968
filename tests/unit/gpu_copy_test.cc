// Tensors with a place: the memory type + device bookkeeping (host by default everywhere) and the
// copies between places through the device layer, on the fake runtime (which checks that each
// copy's kind matches its pointers and counts the copies of each kind).
#include "gpu/copy.h"

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "core/infer_request.h"
#include "gmock/gmock.h"
#include "gpu/fake_runtime.h"
#include "gpu/stream_pool.h"
#include "gtest/gtest.h"

namespace inferd::gpu {
namespace {

using ::testing::HasSubstr;

constexpr std::string_view kBytes = "0123456789abcdef";

TEST(MemoryPlaceTest, TensorsAreOnTheHostByDefault) {
  core::InputTensor in;
  core::OutputTensor out;
  EXPECT_EQ(in.place, MemoryPlace::Host());
  EXPECT_EQ(out.place, MemoryPlace::Host());
  EXPECT_TRUE(in.place.OnHost());
  // Aggregate initialization as the frontends and tests write it keeps the default too.
  core::InputTensor listed{"x", DataType::kFp32, {1}, "abcd"};
  EXPECT_EQ(listed.place.type, MemoryType::kCpu);
}

TEST(MemoryPlaceTest, NamesAreTritons) {
  EXPECT_EQ(MemoryTypeName(MemoryType::kCpu), "CPU");
  EXPECT_EQ(MemoryTypeName(MemoryType::kCpuPinned), "CPU_PINNED");
  EXPECT_EQ(MemoryTypeName(MemoryType::kGpu), "GPU");
  EXPECT_EQ(MemoryPlace::Gpu(1).ToString(), "GPU 1");
  EXPECT_EQ(MemoryPlace::Pinned().ToString(), "CPU_PINNED");
  EXPECT_TRUE(MemoryPlace::Pinned().OnHost());
  EXPECT_FALSE(MemoryPlace::Gpu(0).OnHost());
  EXPECT_NE(MemoryPlace::Gpu(0), MemoryPlace::Gpu(1));
  EXPECT_NE(MemoryPlace::Gpu(0), MemoryPlace::Host());
}

TEST(CopyToPlaceTest, HostToGpuAndBackIsOneCopyEachWay) {
  auto rt = FakeRuntime::WithDevices(1, 8, 6, 1000);
  auto stream = rt->CreateStream(0);
  ASSERT_TRUE(stream.ok());
  {
    auto on_gpu = CopyToPlace(*rt, kBytes, MemoryPlace::Host(), MemoryPlace::Gpu(0), stream->get());
    ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
    EXPECT_EQ(on_gpu->place(), MemoryPlace::Gpu(0));
    EXPECT_EQ(on_gpu->size(), kBytes.size());
    EXPECT_EQ(rt->GetMemoryInfo(0)->free_bytes, 1000u - kBytes.size());  // held on the device
    auto back = CopyToPlace(*rt, on_gpu->view(), on_gpu->place(), MemoryPlace::Host(),
                            stream->get());
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_TRUE((*stream)->Synchronize().ok());
    EXPECT_EQ(back->view(), kBytes);
    EXPECT_EQ(back->place(), MemoryPlace::Host());
  }
  EXPECT_EQ(rt->GetMemoryInfo(0)->free_bytes, 1000u);  // the device buffer was freed
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), 1);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 1);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToDevice), 0);
}

TEST(CopyToPlaceTest, PinnedToGpuThenGpuToGpuOnEitherDevicesStream) {
  auto rt = FakeRuntime::WithDevices(2);
  auto s0 = rt->CreateStream(0);
  auto s1 = rt->CreateStream(1);
  ASSERT_TRUE(s0.ok() && s1.ok());
  auto pinned = PlacedBuffer::Allocate(*rt, MemoryPlace::Pinned(), kBytes.size());
  ASSERT_TRUE(pinned.ok());
  std::memcpy(pinned->data(), kBytes.data(), kBytes.size());
  auto gpu0 = CopyToPlace(*rt, pinned->view(), MemoryPlace::Pinned(), MemoryPlace::Gpu(0),
                          s0->get());
  ASSERT_TRUE(gpu0.ok()) << gpu0.status();
  auto gpu1 = CopyToPlace(*rt, gpu0->view(), MemoryPlace::Gpu(0), MemoryPlace::Gpu(1), s1->get());
  ASSERT_TRUE(gpu1.ok()) << gpu1.status();
  auto gpu1b = CopyToPlace(*rt, gpu0->view(), MemoryPlace::Gpu(0), MemoryPlace::Gpu(1), s0->get());
  ASSERT_TRUE(gpu1b.ok()) << gpu1b.status();
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), 1);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToDevice), 2);
  auto host = CopyToPlace(*rt, gpu1->view(), MemoryPlace::Gpu(1), MemoryPlace::Host(), s1->get());
  ASSERT_TRUE(host.ok()) << host.status();
  EXPECT_EQ(host->view(), kBytes);
}

TEST(CopyToPlaceTest, HostToHostNeedsNoStreamAndNoDevice) {
  FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  auto pinned = CopyToPlace(none, kBytes, MemoryPlace::Host(), MemoryPlace::Pinned(), nullptr);
  ASSERT_TRUE(pinned.ok()) << pinned.status();
  EXPECT_EQ(pinned->view(), kBytes);
  EXPECT_EQ(none.CopyCount(CopyKind::kHostToDevice), 0);
}

TEST(CopyToPlaceTest, RefusalsNameWhatIsWrong) {
  auto rt = FakeRuntime::WithDevices(2, 8, 6, 100);
  auto s1 = rt->CreateStream(1);
  ASSERT_TRUE(s1.ok());

  auto no_stream = CopyToPlace(*rt, kBytes, MemoryPlace::Host(), MemoryPlace::Gpu(0), nullptr);
  EXPECT_EQ(no_stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_stream.status().message(), HasSubstr("a copy from CPU to GPU 0 needs a stream"));

  auto wrong_stream =
      CopyToPlace(*rt, kBytes, MemoryPlace::Host(), MemoryPlace::Gpu(0), s1->get());
  EXPECT_EQ(wrong_stream.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong_stream.status().message(),
              HasSubstr("a copy from CPU to GPU 0 cannot run on a stream of GPU 1"));

  auto no_such = CopyToPlace(*rt, kBytes, MemoryPlace::Host(), MemoryPlace::Gpu(5), s1->get());
  EXPECT_EQ(no_such.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(no_such.status().message(), HasSubstr("GPU 5 does not exist: this host has 2"));

  std::string big(101, 'x');
  auto too_big = CopyToPlace(*rt, big, MemoryPlace::Host(), MemoryPlace::Gpu(1), s1->get());
  EXPECT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);

  FakeRuntime none({}, "no NVIDIA driver on this host: CUDA error 35");
  auto no_gpu = PlacedBuffer::Allocate(none, MemoryPlace::Gpu(0), 4);
  EXPECT_EQ(no_gpu.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_THAT(no_gpu.status().message(), HasSubstr("(no NVIDIA driver on this host"));
  // Nothing was copied by the refused calls.
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), 0);
}

TEST(CopyBetweenTest, AHostPointerPassedAsGpuMemoryIsCaughtByTheFake) {
  auto rt = FakeRuntime::WithDevices(1);
  auto s0 = rt->CreateStream(0);
  ASSERT_TRUE(s0.ok());
  char host_dst[16];
  // Claims the destination is on GPU 0, but it is host memory: a bookkeeping bug.
  absl::Status st = CopyBetween(*rt, host_dst, MemoryPlace::Gpu(0), kBytes.data(),
                                MemoryPlace::Host(), kBytes.size(), s0->get());
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(st.message(), HasSubstr("the destination is not"));
}

// The edge copies (CopyNow) lease their streams from the runtime's pool: copy after copy on a
// device reuses one stream instead of creating and destroying a stream per copy.
TEST(CopyNowTest, SequentialEdgeCopiesReuseOneStreamPerDevice) {
  auto rt = FakeRuntime::WithDevices(2);
  auto gpu0 = PlacedBuffer::Allocate(*rt, MemoryPlace::Gpu(0), kBytes.size());
  auto gpu1 = PlacedBuffer::Allocate(*rt, MemoryPlace::Gpu(1), kBytes.size());
  ASSERT_TRUE(gpu0.ok() && gpu1.ok());
  char back[16] = {};
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(CopyNow(rt.get(), gpu0->data(), MemoryPlace::Gpu(0), kBytes.data(),
                        MemoryPlace::Host(), kBytes.size())
                    .ok());
    ASSERT_TRUE(CopyNow(rt.get(), gpu1->data(), MemoryPlace::Gpu(1), gpu0->data(),
                        MemoryPlace::Gpu(0), kBytes.size())
                    .ok());
    ASSERT_TRUE(CopyNow(rt.get(), back, MemoryPlace::Host(), gpu1->data(), MemoryPlace::Gpu(1),
                        kBytes.size())
                    .ok());
    auto placed = CopyToPlaceNow(rt.get(), gpu0->view(), MemoryPlace::Gpu(0), MemoryPlace::Host());
    ASSERT_TRUE(placed.ok()) << placed.status();
  }
  EXPECT_EQ(std::string_view(back, sizeof back), kBytes);
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), 10);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToDevice), 10);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), 20);
  EXPECT_EQ(rt->StreamsCreated(0), 1);
  EXPECT_EQ(rt->StreamsCreated(1), 1);  // the GPU-to-GPU copy ran on the destination's
}

TEST(CopyNowTest, AFailedCopyDropsItsStream) {
  auto rt = FakeRuntime::WithDevices(1);
  char host[16];
  // Host memory claimed to be on GPU 0: the fake refuses the copy; the stream that saw the
  // error is not handed to the next copy.
  EXPECT_FALSE(
      CopyNow(rt.get(), host, MemoryPlace::Host(), kBytes.data(), MemoryPlace::Gpu(0), 16).ok());
  auto gpu0 = PlacedBuffer::Allocate(*rt, MemoryPlace::Gpu(0), kBytes.size());
  ASSERT_TRUE(CopyNow(rt.get(), gpu0->data(), MemoryPlace::Gpu(0), kBytes.data(),
                      MemoryPlace::Host(), kBytes.size())
                  .ok());
  ASSERT_TRUE(CopyNow(rt.get(), gpu0->data(), MemoryPlace::Gpu(0), kBytes.data(),
                      MemoryPlace::Host(), kBytes.size())
                  .ok());
  EXPECT_EQ(rt->StreamsCreated(0), 2);
}

// Several threads copying at once each get a stream of their own (never more than the pool's
// bound), and every round trip carries its own bytes. Run in the TSan build too.
TEST(CopyNowTest, ConcurrentEdgeCopiesAreCorrectAndBounded) {
  auto rt = FakeRuntime::WithDevices(2);
  constexpr int kThreads = 8;
  constexpr int kRounds = 200;
  std::vector<int> failures(kThreads, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const int device = t % 2;
      for (int i = 0; i < kRounds; ++i) {
        const std::string bytes = std::to_string(t * 100000 + i) + std::string(64, 'a' + t);
        auto on_gpu = CopyToPlaceNow(rt.get(), bytes, MemoryPlace::Host(), MemoryPlace::Gpu(device));
        if (!on_gpu.ok()) {
          ++failures[t];
          continue;
        }
        auto back = CopyToPlaceNow(rt.get(), on_gpu->view(), on_gpu->place(), MemoryPlace::Host());
        if (!back.ok() || back->view() != bytes) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
  EXPECT_EQ(rt->CopyCount(CopyKind::kHostToDevice), kThreads * kRounds);
  EXPECT_EQ(rt->CopyCount(CopyKind::kDeviceToHost), kThreads * kRounds);
  for (int d = 0; d < 2; ++d) {
    EXPECT_GE(rt->StreamsCreated(d), 1);
    EXPECT_LE(rt->StreamsCreated(d), kEdgeStreamsPerDevice);
  }
}

// At the bound, a copy waits for a stream to come back rather than creating one more.
TEST(StreamPoolTest, AtTheBoundAcquireWaitsForTheStreamGivenBack) {
  auto rt = FakeRuntime::WithDevices(1);
  StreamPool pool(*rt, 1);
  auto first = pool.Acquire(0);
  ASSERT_TRUE(first.ok()) << first.status();
  const Stream* held = &first->stream();
  const Stream* second_got = nullptr;
  std::thread second([&] {
    auto lease = pool.Acquire(0);  // blocks until `first` is given back
    if (lease.ok()) second_got = &lease->stream();
  });
  { auto release = std::move(*first); }
  second.join();
  EXPECT_EQ(second_got, held);
  EXPECT_EQ(rt->StreamsCreated(0), 1);
  // A discarded stream is replaced by a new one.
  {
    auto lease = pool.Acquire(0);
    ASSERT_TRUE(lease.ok());
    lease->Discard();
  }
  ASSERT_TRUE(pool.Acquire(0).ok());
  EXPECT_EQ(rt->StreamsCreated(0), 2);
  EXPECT_EQ(pool.Acquire(3).status().code(), absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace inferd::gpu
