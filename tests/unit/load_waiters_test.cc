// The on-demand load waiters and their reaper: woken when the load ends (ready or failed),
// when the wait limit passes, when the request's deadline passes or its client leaves, at
// shutdown; each exactly once, with many threads joining while loads end. No sleeps: every
// test waits on the callbacks themselves.
#include "repository/load_waiters.h"

#include <atomic>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/infer_request.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::repository {
namespace {

using ::testing::HasSubstr;

// Collects one waiter's answer. inferd::Mutex, not absl::Notification: ThreadSanitizer sees
// its hand-over (Debian's Abseil is not built with TSan).
struct Answer {
  inferd::Mutex mu;
  bool answered ABSL_GUARDED_BY(mu) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu);
  std::atomic<int> calls{0};
  std::function<void(absl::Status)> then() {
    return [this](absl::Status st) {
      calls.fetch_add(1);
      inferd::MutexLock lock(&mu);
      status_ = std::move(st);
      answered = true;
    };
  }
  bool done() {
    inferd::MutexLock lock(&mu);
    return answered;
  }
  // Generous: never reached unless the answer is lost.
  bool Wait() {
    inferd::MutexLock lock(&mu);
    auto is_answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return answered; };
    return mu.AwaitWithTimeout(absl::Condition(&is_answered), absl::Minutes(2));
  }
  absl::Status status() {
    inferd::MutexLock lock(&mu);
    return status_;
  }
};

constexpr absl::Duration kLong = absl::Hours(1);  // a wait limit no test reaches

TEST(LoadWaitersTest, TheFirstJoinStartsTheLoadAndOthersJoinIt) {
  LoadWaiters waiters(kLong);
  Answer a, b;
  EXPECT_FALSE(waiters.IsPending("m"));
  EXPECT_EQ(waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {}), true),
            LoadWaiters::Joined::kStarted);
  EXPECT_TRUE(waiters.IsPending("m"));
  EXPECT_EQ(waiters.PendingSource("m"), "");
  EXPECT_EQ(waiters.Join("m", "", waiters.NewWaiter("m", b.then(), {}), true),
            LoadWaiters::Joined::kJoined);
  EXPECT_FALSE(a.done());
  waiters.Finish("m", absl::OkStatus());
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_TRUE(a.status().ok());
  EXPECT_TRUE(b.status().ok());
  EXPECT_FALSE(waiters.IsPending("m"));
}

TEST(LoadWaitersTest, WithoutMayStartOnlyAPendingLoadIsJoined) {
  LoadWaiters waiters(kLong);
  Answer a, b;
  auto w = waiters.NewWaiter("m", a.then(), {});
  EXPECT_EQ(waiters.Join("m", "", w, /*may_start=*/false), LoadWaiters::Joined::kNo);
  EXPECT_FALSE(waiters.IsPending("m"));
  ASSERT_EQ(waiters.Join("m", "src", waiters.NewWaiter("m", b.then(), {}), true),
            LoadWaiters::Joined::kStarted);
  EXPECT_EQ(waiters.PendingSource("m"), "src");
  EXPECT_EQ(waiters.Join("m", "", w, /*may_start=*/false), LoadWaiters::Joined::kJoined);
  waiters.Finish("m", absl::OkStatus());
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
}

TEST(LoadWaitersTest, AFailedLoadAnswersEachWaiterWithItsError) {
  LoadWaiters waiters(kLong);
  Answer a, b;
  waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {}), true);
  waiters.Join("m", "", waiters.NewWaiter("m", b.then(), {}), true);
  waiters.Finish("m", absl::InvalidArgumentError("model 'm': bad config"));
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(b.status().message(), HasSubstr("bad config"));
}

// A client that got a failed load's error may ask for another source of the same name before
// Finish has answered every waiter: the name is free, and the new request starts its own load
// instead of getting the old error (CI saw a 409 "serves 'missing.tar.gz'" here).
TEST(LoadWaitersTest, AFailedLoadBindsNoNameWhileItAnswers) {
  LoadWaiters waiters(kLong);
  Answer next, same;
  std::optional<std::string> seen = "unset";
  LoadWaiters::Joined other = LoadWaiters::Joined::kNo;
  LoadWaiters::Joined again = LoadWaiters::Joined::kNo;
  auto first = waiters.NewWaiter(
      "m",
      [&](absl::Status st) {
        EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
        seen = waiters.PendingSource("m");
        again = waiters.Join("m", "missing", waiters.NewWaiter("m", same.then(), {}), true);
        other = waiters.Join("m", "good", waiters.NewWaiter("m", next.then(), {}), true);
      },
      {});
  ASSERT_EQ(waiters.Join("m", "missing", first, true), LoadWaiters::Joined::kStarted);
  EXPECT_EQ(waiters.PendingSource("m"), "missing");
  waiters.Finish("m", absl::NotFoundError("no 'missing'"));
  EXPECT_EQ(seen, std::nullopt);
  // The same source joins the failed load and gets its error.
  EXPECT_EQ(again, LoadWaiters::Joined::kJoined);
  ASSERT_TRUE(same.Wait());
  EXPECT_EQ(same.status().code(), absl::StatusCode::kNotFound);
  // Another source starts its own load, which the failed one's end neither answers nor ends.
  EXPECT_EQ(other, LoadWaiters::Joined::kStarted);
  EXPECT_FALSE(next.done());
  EXPECT_EQ(waiters.PendingSource("m"), "good");
  waiters.Finish("m", absl::OkStatus());
  ASSERT_TRUE(next.Wait());
  EXPECT_TRUE(next.status().ok());
  EXPECT_FALSE(waiters.IsPending("m"));
}

TEST(LoadWaitersTest, TheWaitLimitAnswersUnavailableAndTheLoadGoesOn) {
  LoadWaiters waiters(absl::Milliseconds(1));
  Answer a;
  waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {}), true);
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(a.status().message(), HasSubstr("model 'm' is still loading after 1ms"));
  EXPECT_EQ(waiters.timeouts(), 1u);
  EXPECT_TRUE(waiters.IsPending("m"));  // the load goes on
  waiters.Finish("m", absl::OkStatus());
  EXPECT_EQ(a.calls.load(), 1);  // answered once only
}

TEST(LoadWaitersTest, TheRequestsOwnDeadlineAnswersDeadlineExceeded) {
  LoadWaiters waiters(kLong);
  Answer a, b;
  waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {nullptr, core::NowNs()}), true);
  waiters.Join("m", "", waiters.NewWaiter("m", b.then(), {}), true);
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(waiters.timeouts(), 0u);
  EXPECT_FALSE(b.done());
  waiters.Finish("m", absl::OkStatus());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.calls.load(), 1);
}

TEST(LoadWaitersTest, ACancelledRequestIsAnsweredCancelled) {
  LoadWaiters waiters(kLong);
  Answer a, b;
  auto token = std::make_shared<core::CancellationToken>();
  waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {token, 0}), true);
  waiters.Join("m", "", waiters.NewWaiter("m", b.then(), {}), true);
  token->Cancel();
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kCancelled);
  waiters.Finish("m", absl::OkStatus());
  ASSERT_TRUE(b.Wait());
  EXPECT_TRUE(b.status().ok());
  EXPECT_EQ(a.calls.load(), 1);
}

TEST(LoadWaitersTest, ACancellationBeforeTheJoinIsNotLost) {
  LoadWaiters waiters(kLong);
  Answer a;
  auto token = std::make_shared<core::CancellationToken>();
  token->Cancel();
  waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {token, 0}), true);
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kCancelled);
}

TEST(LoadWaitersTest, FireAllAnswersWhoeverStillWaits) {
  LoadWaiters waiters(kLong);
  Answer a, b;
  waiters.Join("m", "", waiters.NewWaiter("m", a.then(), {}), true);
  waiters.Join("n", "", waiters.NewWaiter("n", b.then(), {}), true);
  waiters.Finish("n", absl::OkStatus());
  ASSERT_TRUE(b.Wait());
  waiters.StopReaper();
  waiters.FireAll(absl::UnavailableError("the server is shutting down"));
  ASSERT_TRUE(a.Wait());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(b.calls.load(), 1);
  EXPECT_TRUE(b.status().ok());
}

// Threads join loads of a few models while other threads end them; every waiter is answered
// exactly once, by the load it joined or by a later one (none is lost between loads).
TEST(LoadWaitersTest, NoWaiterIsLostOrAnsweredTwiceUnderManyThreads) {
  constexpr int kJoiners = 8;
  constexpr int kPerJoiner = 500;
  const std::vector<std::string> models = {"a", "b", "c"};
  LoadWaiters waiters(kLong);
  std::atomic<int> answered{0};
  std::atomic<int> twice{0};
  std::atomic<bool> joining{true};
  std::vector<std::unique_ptr<std::atomic<int>>> calls;
  for (int i = 0; i < kJoiners * kPerJoiner; ++i) calls.push_back(std::make_unique<std::atomic<int>>(0));
  std::vector<std::thread> joiners;
  for (int t = 0; t < kJoiners; ++t) {
    joiners.emplace_back([&, t] {
      for (int i = 0; i < kPerJoiner; ++i) {
        const int id = t * kPerJoiner + i;
        const std::string& m = models[id % models.size()];
        auto w = waiters.NewWaiter(m, [&, id](absl::Status st) {
          EXPECT_TRUE(st.ok());
          if (calls[id]->fetch_add(1) > 0) twice.fetch_add(1);
          answered.fetch_add(1);
        }, {});
        waiters.Join(m, "", w, true);
      }
    });
  }
  std::thread finisher([&] {
    while (joining.load()) {
      for (const auto& m : models) waiters.Finish(m, absl::OkStatus());
    }
  });
  for (auto& t : joiners) t.join();
  joining.store(false);
  finisher.join();
  for (const auto& m : models) waiters.Finish(m, absl::OkStatus());  // the last loads end
  EXPECT_EQ(answered.load(), kJoiners * kPerJoiner);
  EXPECT_EQ(twice.load(), 0);
  for (const auto& m : models) EXPECT_FALSE(waiters.IsPending(m));
}

}  // namespace
}  // namespace inferd::repository
