// The model version state machine: every legal transition is taken, every other one refused
// with FAILED_PRECONDITION and the state left as it was.
#include "repository/version_state.h"

#include <set>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace inferd::repository {
namespace {

using ::testing::HasSubstr;

constexpr ModelState kAll[] = {ModelState::kLoading, ModelState::kReady, ModelState::kUnloading,
                               ModelState::kUnavailable};

// The table as the header documents it.
const std::set<std::pair<ModelState, ModelState>> kLegal = {
    {ModelState::kLoading, ModelState::kReady},
    {ModelState::kLoading, ModelState::kUnavailable},
    {ModelState::kReady, ModelState::kUnloading},
    {ModelState::kUnloading, ModelState::kUnavailable},
    {ModelState::kUnavailable, ModelState::kLoading},
};

// A VersionState driven into `target` along legal transitions.
VersionState In(ModelState target) {
  VersionState s("model 'm' version 1");
  switch (target) {
    case ModelState::kLoading:
      break;
    case ModelState::kReady:
      EXPECT_TRUE(s.TransitionTo(ModelState::kReady).ok());
      break;
    case ModelState::kUnloading:
      EXPECT_TRUE(s.TransitionTo(ModelState::kReady).ok());
      EXPECT_TRUE(s.TransitionTo(ModelState::kUnloading).ok());
      break;
    case ModelState::kUnavailable:
      EXPECT_TRUE(s.TransitionTo(ModelState::kUnavailable, "failed").ok());
      break;
  }
  EXPECT_EQ(s.state(), target);
  return s;
}

TEST(VersionStateTest, StartsLoading) {
  VersionState s;
  EXPECT_EQ(s.state(), ModelState::kLoading);
  EXPECT_FALSE(s.ready());
  EXPECT_TRUE(s.reason().empty());
}

TEST(VersionStateTest, TheTableIsTheDocumentedOne) {
  for (ModelState from : kAll) {
    for (ModelState to : kAll) {
      EXPECT_EQ(VersionState::IsValidTransition(from, to), kLegal.count({from, to}) == 1)
          << ModelStateName(from) << " -> " << ModelStateName(to);
    }
  }
}

TEST(VersionStateTest, EveryLegalTransitionIsTaken) {
  for (const auto& [from, to] : kLegal) {
    VersionState s = In(from);
    EXPECT_TRUE(s.TransitionTo(to, "why").ok()) << ModelStateName(from) << " -> " << ModelStateName(to);
    EXPECT_EQ(s.state(), to);
    EXPECT_EQ(s.reason(), "why");
    EXPECT_EQ(s.ready(), to == ModelState::kReady);
  }
}

TEST(VersionStateTest, EveryOtherTransitionIsRefusedAndChangesNothing) {
  int refused = 0;
  for (ModelState from : kAll) {
    for (ModelState to : kAll) {
      if (kLegal.count({from, to})) continue;
      VersionState s = In(from);
      s.set_reason("before");
      absl::Status st = s.TransitionTo(to, "after");
      EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition)
          << ModelStateName(from) << " -> " << ModelStateName(to);
      EXPECT_THAT(st.message(), HasSubstr("model 'm' version 1"));
      EXPECT_THAT(st.message(), HasSubstr(std::string(ModelStateName(from))));
      EXPECT_THAT(st.message(), HasSubstr(std::string(ModelStateName(to))));
      EXPECT_EQ(s.state(), from);
      EXPECT_EQ(s.reason(), "before");
      ++refused;
    }
  }
  EXPECT_EQ(refused, 16 - static_cast<int>(kLegal.size()));
}

TEST(VersionStateTest, AWholeLifeAndALoadAgain) {
  VersionState s("model 'm' version 3");
  ASSERT_TRUE(s.TransitionTo(ModelState::kReady).ok());
  s.set_reason("reload failed, the previous load keeps serving: bad file");
  EXPECT_TRUE(s.ready());  // a failed reload changes only the reason
  ASSERT_TRUE(s.TransitionTo(ModelState::kUnloading).ok());
  ASSERT_TRUE(s.TransitionTo(ModelState::kUnavailable, "unloaded").ok());
  EXPECT_EQ(s.reason(), "unloaded");
  ASSERT_TRUE(s.TransitionTo(ModelState::kLoading).ok());
  EXPECT_TRUE(s.reason().empty());
  // Ready cannot be skipped to unavailable without going through unloading.
  ASSERT_TRUE(s.TransitionTo(ModelState::kReady).ok());
  EXPECT_FALSE(s.TransitionTo(ModelState::kUnavailable).ok());
  EXPECT_TRUE(s.ready());
}

TEST(VersionStateTest, NamesAreTheIndexs) {
  EXPECT_EQ(ModelStateName(ModelState::kLoading), "LOADING");
  EXPECT_EQ(ModelStateName(ModelState::kReady), "READY");
  EXPECT_EQ(ModelStateName(ModelState::kUnloading), "UNLOADING");
  EXPECT_EQ(ModelStateName(ModelState::kUnavailable), "UNAVAILABLE");
}

}  // namespace
}  // namespace inferd::repository
