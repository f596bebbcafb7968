// A closed-loop C++ async gRPC client for the KServe v2 ModelInfer RPC: keeps `concurrency`
// requests in flight for `seconds`, with raw_input_contents, and prints infer/s and p50/p99.
//   grpc_client <host:port> <model> <concurrency> <seconds> <input name> <datatype> <elements>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "grpc_service.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace {

struct Call {
  grpc::ClientContext ctx;
  inference::ModelInferResponse response;
  grpc::Status status;
  std::unique_ptr<grpc::ClientAsyncResponseReader<inference::ModelInferResponse>> rpc;
  std::chrono::steady_clock::time_point start;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr, "usage: %s host:port model concurrency seconds input datatype elements\n", argv[0]);
    return 2;
  }
  const std::string target = argv[1];
  const int concurrency = std::atoi(argv[3]);
  const double seconds = std::atof(argv[4]);
  const size_t elements = std::strtoul(argv[7], nullptr, 10);

  inference::ModelInferRequest request;
  request.set_model_name(argv[2]);
  auto* in = request.add_inputs();
  in->set_name(argv[5]);
  in->set_datatype(argv[6]);
  in->add_shape(1);
  in->add_shape(static_cast<int64_t>(elements));
  request.add_raw_input_contents()->assign(elements * 4, '\0');

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  auto stub = inference::GRPCInferenceService::NewStub(channel);
  grpc::CompletionQueue cq;

  auto launch = [&] {
    auto* call = new Call;
    call->start = std::chrono::steady_clock::now();
    call->rpc = stub->AsyncModelInfer(&call->ctx, request, &cq);
    call->rpc->Finish(&call->response, &call->status, call);
  };
  const auto begin = std::chrono::steady_clock::now();
  const auto end = begin + std::chrono::duration<double>(seconds);
  for (int i = 0; i < concurrency; ++i) launch();
  std::vector<double> latencies_us;
  size_t failures = 0, in_flight = concurrency;
  void* tag;
  bool ok;
  while (in_flight > 0 && cq.Next(&tag, &ok)) {
    auto* call = static_cast<Call*>(tag);
    const auto now = std::chrono::steady_clock::now();
    if (!ok || !call->status.ok()) {
      if (failures++ < 3) std::fprintf(stderr, "error: %s\n", call->status.error_message().c_str());
    } else {
      latencies_us.push_back(std::chrono::duration<double, std::micro>(now - call->start).count());
    }
    delete call;
    --in_flight;
    if (now < end) {
      launch();
      ++in_flight;
    }
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  std::sort(latencies_us.begin(), latencies_us.end());
  auto pct = [&](double p) {
    return latencies_us.empty() ? 0.0 : latencies_us[std::min(latencies_us.size() - 1, size_t(p * latencies_us.size()))];
  };
  std::printf("infer_per_s %.1f\np50_us %.1f\np99_us %.1f\nfailures %zu\n",
              latencies_us.size() / elapsed, pct(0.5), pct(0.99), failures);
  return failures ? 1 : 0;
}
