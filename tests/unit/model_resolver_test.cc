// The residency resolve step (server/model_resolver.h) against a fake store: which answers run
// at once, which wait for a load, and the statuses and messages each failure carries.
#include "server/model_resolver.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace inferd::server {
namespace {

struct FakeModel {
  int id = 0;
};

// A store whose lookups answer from `models` (absent: `miss`), and whose waits are recorded for
// the test to answer.
struct FakeStore {
  struct WaitLimits {
    std::shared_ptr<core::CancellationToken> cancel;
    uint64_t deadline_ns = 0;
  };
  struct Waiting {
    std::string name;
    std::string source;
    WaitLimits limits;
    std::function<void(absl::Status)> then;
  };

  absl::StatusOr<std::shared_ptr<const FakeModel>> Get(std::string_view name, int64_t) {
    ++gets;
    auto it = models.find(std::string(name));
    if (it == models.end()) return miss;
    return it->second;
  }
  void WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
                     const std::string& source) {
    waits.push_back({name, source, {}, std::move(then)});
  }
  void WhenAvailable(const std::string& name, std::function<void(absl::Status)> then,
                     const WaitLimits& limits) {
    waits.push_back({name, "", limits, std::move(then)});
  }
  std::map<std::string, std::string> UrlModels() const { return url_models; }

  std::map<std::string, std::shared_ptr<const FakeModel>> models;
  absl::Status miss = absl::NotFoundError("unknown model 'm'");
  std::map<std::string, std::string> url_models;
  std::vector<Waiting> waits;
  int gets = 0;
};

using Result = absl::StatusOr<std::shared_ptr<const FakeModel>>;

class ModelResolverTest : public ::testing::Test {
 protected:
  // Resolves `name` with a continuation that records its one call.
  void Resolve(const std::string& name, const WaitBounds& bounds = {},
               const ResolveOptions& options = {}, bool on_demand = true) {
    ModelResolver<FakeStore> resolver(&store_, on_demand);
    resolver.Resolve(name, -1, bounds, options, [this](Result r) {
      ++calls_;
      result_ = std::move(r);
    });
  }

  FakeStore store_;
  int calls_ = 0;
  Result result_ = absl::UnknownError("not called");
};

TEST_F(ModelResolverTest, AResidentModelRunsAtOnceWithOneLookup) {
  store_.models["m"] = std::make_shared<FakeModel>(FakeModel{7});
  Resolve("m");
  ASSERT_EQ(calls_, 1);
  ASSERT_TRUE(result_.ok());
  EXPECT_EQ((*result_)->id, 7);
  EXPECT_EQ(store_.gets, 1);
  EXPECT_TRUE(store_.waits.empty());
}

TEST_F(ModelResolverTest, AMissingModelWaitsForTheStoreThenLooksUpAgain) {
  Resolve("m");
  EXPECT_EQ(calls_, 0);
  ASSERT_EQ(store_.waits.size(), 1u);
  store_.models["m"] = std::make_shared<FakeModel>(FakeModel{3});
  store_.waits[0].then(absl::OkStatus());
  ASSERT_EQ(calls_, 1);
  ASSERT_TRUE(result_.ok());
  EXPECT_EQ((*result_)->id, 3);
}

TEST_F(ModelResolverTest, NothingLoadsItTheLookupAnswers) {
  // The store answers OK at once when nothing can load the model: its lookup says why.
  Resolve("m");
  ASSERT_EQ(store_.waits.size(), 1u);
  store_.waits[0].then(absl::OkStatus());
  ASSERT_EQ(calls_, 1);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(result_.status().message(), "unknown model 'm'");
}

TEST_F(ModelResolverTest, ALookupErrorNoLoadChangesAnswersAtOnce) {
  store_.miss = absl::InvalidArgumentError("ambiguous");
  Resolve("m");
  ASSERT_EQ(calls_, 1);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(store_.waits.empty());
}

TEST_F(ModelResolverTest, TheStoresFailuresPassThrough) {
  for (absl::Status st : {absl::UnavailableError("still loading after 1 s (--model-load-wait-secs)"),
                          absl::ResourceExhaustedError("the memory budget"),
                          absl::AlreadyExistsError("serves another")}) {
    store_.waits.clear();
    calls_ = 0;
    Resolve("m");
    ASSERT_EQ(store_.waits.size(), 1u);
    store_.waits[0].then(st);
    ASSERT_EQ(calls_, 1);
    EXPECT_EQ(result_.status(), st);
  }
}

TEST_F(ModelResolverTest, TheWaitEndsAtTheEarlierOfTimeoutAndDeadline) {
  auto cancel = std::make_shared<core::CancellationToken>();
  WaitBounds b{&cancel, /*received_ns=*/1'000'000'000, /*timeout_us=*/300'000,
               /*deadline_ns=*/2'000'000'000};
  Resolve("m", b);
  ASSERT_EQ(store_.waits.size(), 1u);
  EXPECT_EQ(store_.waits[0].limits.deadline_ns, 1'300'000'000u);
  EXPECT_EQ(store_.waits[0].limits.cancel, cancel);
  store_.waits.clear();
  b.deadline_ns = 1'100'000'000;
  Resolve("m", b);
  ASSERT_EQ(store_.waits.size(), 1u);
  EXPECT_EQ(store_.waits[0].limits.deadline_ns, 1'100'000'000u);
}

TEST_F(ModelResolverTest, ADeadlineNamesTheLimitThatPassed) {
  const uint64_t now = core::NowNs();
  WaitBounds b{nullptr, now - 500'000'000, /*timeout_us=*/300'000, 0};
  Resolve("m", b);
  ASSERT_EQ(store_.waits.size(), 1u);
  store_.waits[0].then(absl::DeadlineExceededError(""));
  ASSERT_EQ(calls_, 1);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(result_.status().message().find(
                "request for model 'm' timed out: waited "),
            std::string::npos)
      << result_.status();
  EXPECT_NE(result_.status().message().find("(timeout 300000 us, waiting for the model to load)"),
            std::string::npos)
      << result_.status();

  store_.waits.clear();
  WaitBounds client{nullptr, core::NowNs(), 0, core::NowNs()};
  Resolve("m", client);
  store_.waits[0].then(absl::DeadlineExceededError(""));
  EXPECT_NE(result_.status().message().find("(the client's deadline, waiting for the model to load)"),
            std::string::npos)
      << result_.status();
}

TEST_F(ModelResolverTest, ACancelledWaitSaysTheClientLeft) {
  auto cancel = std::make_shared<core::CancellationToken>();
  Resolve("m", WaitBounds{&cancel, core::NowNs(), 0, 0});
  cancel->Cancel();
  store_.waits[0].then(absl::CancelledError(""));
  ASSERT_EQ(calls_, 1);
  EXPECT_EQ(result_.status().code(), absl::StatusCode::kCancelled);
  EXPECT_NE(result_.status().message().find("request for model 'm' was cancelled by the client"),
            std::string::npos)
      << result_.status();
}

TEST_F(ModelResolverTest, MultiModelNotLoadedIs404UnlessLoadable) {
  ResolveOptions mm;
  mm.multi_model = true;
  Resolve("m", {}, mm, /*on_demand=*/false);
  ASSERT_EQ(calls_, 1);
  EXPECT_EQ(result_.status(), absl::NotFoundError("model 'm' is not loaded"));
  EXPECT_TRUE(store_.waits.empty());
  // Loaded through the multi-model API and evicted since: it waits for its reload.
  calls_ = 0;
  store_.url_models["m"] = "/models/m.tar.gz";
  Resolve("m", {}, mm, /*on_demand=*/false);
  EXPECT_EQ(calls_, 0);
  EXPECT_EQ(store_.waits.size(), 1u);
  // On demand, the store decides.
  store_.url_models.clear();
  Resolve("m", {}, mm, /*on_demand=*/true);
  EXPECT_EQ(store_.waits.size(), 2u);
}

TEST_F(ModelResolverTest, ATargetModelIsCheckedEvenWhenResident) {
  store_.models["m"] = std::make_shared<FakeModel>(FakeModel{5});
  ResolveOptions target;
  target.source_name = "m.tar.gz";
  target.multi_model = true;
  Resolve("m", {}, target);
  ASSERT_EQ(store_.waits.size(), 1u);
  EXPECT_EQ(store_.waits[0].source, "m.tar.gz");
  store_.waits[0].then(absl::OkStatus());
  ASSERT_EQ(calls_, 1);
  ASSERT_TRUE(result_.ok());
  EXPECT_EQ((*result_)->id, 5);
  EXPECT_EQ(store_.gets, 1);  // the one lookup's model, not a second use
}

TEST_F(ModelResolverTest, AMoveOnlyContinuationIsKeptWhileItWaits) {
  ModelResolver<FakeStore> resolver(&store_, true);
  auto owned = std::make_unique<int>(42);
  int seen = 0;
  resolver.Resolve("m", -1, {}, {}, [owned = std::move(owned), &seen](Result r) mutable {
    seen = r.ok() ? *owned : -*owned;
  });
  ASSERT_EQ(store_.waits.size(), 1u);
  store_.waits[0].then(absl::UnavailableError("x"));
  EXPECT_EQ(seen, -42);
}

}  // namespace
}  // namespace inferd::server
