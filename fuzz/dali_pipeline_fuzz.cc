// Fuzzes the dali backend's model.dali reader (the PipelineDef protobuf and DALI's argument
// encoding) and, for what parses, the building of every operator from its arguments and one run
// of the pipeline on small non-image samples (so decoders fail cleanly and the other operators
// run with whatever arguments the input gives them).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backends/dali/dali_ops.h"
#include "backends/dali/dali_pipeline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace inferd::backends::dali;
  auto graph = ParsePipeline(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!graph.ok()) return 0;
  std::vector<std::unique_ptr<Operator>> ops;
  for (const OpNode& node : graph->ops) {
    if (node.op == "ExternalSource") {
      ops.push_back(nullptr);
      continue;
    }
    auto op = MakeOperator(node);
    if (!op.ok()) return 0;
    ops.push_back(*std::move(op));
  }
  RunContext ctx;
  ctx.batch_size = 2;
  ctx.max_pixels = 1 << 14;
  std::map<std::string, Batch> edges;
  for (const auto& in : graph->inputs) {
    Sample s;
    s.type = DaliType::kUint8;
    s.shape = {2, 3, 3};
    s.layout = "HWC";
    s.values.assign(18, 7.0f);
    edges[in.edge] = Batch(2, s);
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i] == nullptr) continue;
    std::vector<const Batch*> inputs;
    for (const auto& e : graph->ops[i].inputs) inputs.push_back(&edges[e]);
    Batch out;
    if (!ops[i]->Run(inputs, &out, ctx).ok()) return 0;
    if (out.size() != ctx.batch_size) __builtin_trap();
    edges[graph->ops[i].output] = std::move(out);
  }
  return 0;
}
