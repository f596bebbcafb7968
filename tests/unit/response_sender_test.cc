#include "core/response_sender.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace inferd::core {
namespace {

struct Seen {
  bool has_response;
  bool final;
  std::string model;
  std::string id;
  absl::StatusCode code;
};

ResponseCallback Record(std::vector<Seen>* seen) {
  return [seen](std::unique_ptr<InferResponse> r, bool final) {
    seen->push_back({r != nullptr, final, r ? r->model_name : "", r ? r->id : "",
                     r ? r->status.code() : absl::StatusCode::kOk});
  };
}

TEST(ResponseSenderTest, SendsResponsesThenFinalAndRefusesAfterFinal) {
  std::vector<Seen> seen;
  auto sender = std::make_shared<ResponseSender>("m", 1, "req7", Record(&seen));
  ASSERT_TRUE(sender->Send(sender->MakeResponse(), false).ok());
  ASSERT_TRUE(sender->Send(std::make_unique<InferResponse>(), false).ok());
  EXPECT_FALSE(sender->closed());
  ASSERT_TRUE(sender->SendFinal().ok());
  EXPECT_TRUE(sender->closed());
  EXPECT_EQ(sender->responses_sent(), 2u);
  auto late = sender->Send(sender->MakeResponse(), false);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(std::string(late.message()).find("already sent its final flag"), std::string::npos);
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen[0].has_response);
  EXPECT_FALSE(seen[0].final);
  // A bare response is stamped with the request's model and id.
  EXPECT_EQ(seen[1].model, "m");
  EXPECT_EQ(seen[1].id, "req7");
  EXPECT_FALSE(seen[2].has_response);
  EXPECT_TRUE(seen[2].final);
}

// The server's output edge runs on every response before the sink: the edge added last first
// (as on_complete wrappers), not on the flag alone, not once closed.
TEST(ResponseSenderTest, EdgesRunOnEachResponseLastAddedFirst) {
  std::vector<std::string> order;
  auto sender = std::make_shared<ResponseSender>(
      "m", 1, "", [&](std::unique_ptr<InferResponse> r, bool) {
        order.push_back(r == nullptr ? "sink:flag" : "sink:" + r->id);
      });
  sender->AddEdge([&](InferResponse* r) { order.push_back("regions:" + r->id); });
  sender->AddEdge([&](InferResponse* r) {
    order.push_back("gpu:" + r->id);
    r->id = "moved";
  });
  ASSERT_TRUE(sender->Send(sender->MakeResponse(), false).ok());
  ASSERT_TRUE(sender->SendFinal().ok());
  EXPECT_FALSE(sender->Send(sender->MakeResponse(), true).ok());
  EXPECT_EQ(order, (std::vector<std::string>{"gpu:", "regions:moved", "sink:moved", "sink:flag"}));
}

TEST(ResponseSenderTest, NullResponseMustBeFinal) {
  std::vector<Seen> seen;
  ResponseSender sender("m", 1, "", Record(&seen));
  EXPECT_EQ(sender.Send(nullptr, false).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(seen.empty());
  EXPECT_TRUE(sender.SendError(absl::InvalidArgumentError("bad IN")).ok());
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].final);
  EXPECT_EQ(seen[0].code, absl::StatusCode::kInvalidArgument);
}

TEST(ResponseSenderTest, DroppedWithoutFinalSendsInternalError) {
  std::vector<Seen> seen;
  {
    ResponseSender sender("m", 1, "x", Record(&seen));
    ASSERT_TRUE(sender.Send(sender.MakeResponse(), false).ok());
  }
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_TRUE(seen[1].final);
  EXPECT_EQ(seen[1].code, absl::StatusCode::kInternal);
}

TEST(ResponseSenderTest, ConcurrentSendersNeverOverlapAndOneFinalWins) {
  std::atomic<int> inside{0};
  std::atomic<int> overlaps{0};
  std::atomic<int> finals{0};
  std::atomic<int> calls_after_final{0};
  auto sender = std::make_shared<ResponseSender>(
      "m", 1, "", [&](std::unique_ptr<InferResponse>, bool final) {
        if (inside.fetch_add(1) != 0) overlaps.fetch_add(1);
        if (finals.load() != 0) calls_after_final.fetch_add(1);
        if (final) finals.fetch_add(1);
        inside.fetch_sub(1);
      });
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([sender] {
      for (int i = 0; i < 200; ++i) (void)sender->Send(sender->MakeResponse(), false);
      (void)sender->SendFinal();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(finals.load(), 1);
  EXPECT_EQ(calls_after_final.load(), 0);
  EXPECT_LE(sender->responses_sent(), 800u);
}

}  // namespace
}  // namespace inferd::core

namespace inferd::core {
namespace {

TEST(ResponseSenderTest, FollowsTheRequestsCancellationToken) {
  ResponseSender sender("m", 1, "", [](std::unique_ptr<InferResponse>, bool) {});
  auto token = std::make_shared<CancellationToken>();
  sender.FollowCancellation(token);
  EXPECT_FALSE(sender.IsCancelled());
  token->Cancel();
  EXPECT_TRUE(sender.IsCancelled());
  (void)sender.SendFinal();
}

}  // namespace
}  // namespace inferd::core
