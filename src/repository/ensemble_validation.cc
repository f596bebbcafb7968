#include "repository/ensemble_validation.h"

#include <optional>

#include "common/strings.h"

namespace inferd::repository {
namespace {

// What is known of one ensemble tensor: its type and full shape (batch dimension included as
// -1 when its model batches); shape is unknown behind a `reshape`.
struct TensorInfo {
  inference::DataType type = inference::TYPE_INVALID;
  std::optional<Shape> shape;
  std::string source;  // "ensemble input 'x'" or "step 1 (model 'm') output 'y'"
  // The nearest decoupled step upstream (its index), whose every response carries a new value
  // of this tensor; -1 when none.
  int decoupled_from = -1;
};

template <typename T>
std::optional<Shape> FullShape(const T& tensor, bool batching) {
  if (tensor.has_reshape()) return std::nullopt;
  Shape s;
  if (batching) s.push_back(-1);
  s.insert(s.end(), tensor.dims().begin(), tensor.dims().end());
  return s;
}

bool Compatible(const Shape& a, const Shape& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != -1 && b[i] != -1 && a[i] != b[i]) return false;
  }
  return true;
}

template <typename List>
std::string Names(const List& tensors) {
  std::vector<std::string> names;
  for (const auto& t : tensors) names.push_back(t.name());
  return names.empty() ? "none" : inferd::StrJoin(names, ", ");
}

}  // namespace

absl::Status ValidateEnsembleSteps(const config::ModelConfig& ensemble,
                                   const scheduling::EnsembleGraph& graph,
                                   const std::vector<const config::ModelConfig*>& steps) {
  const std::string& name = ensemble.name();
  const bool batching = ensemble.max_batch_size() > 0;
  std::vector<TensorInfo> info(graph.tensors.size());
  for (size_t t = 0; t < graph.num_inputs; ++t) {
    const auto& in = ensemble.input(static_cast<int>(t));
    info[t] = {in.data_type(), FullShape(in, batching),
               inferd::StrCat("ensemble input '", in.name(), "'")};
  }
  for (size_t s : graph.order) {
    const auto& step = graph.steps[s];
    const config::ModelConfig& model = *steps[s];
    const std::string where =
        inferd::StrCat("ensemble '", name, "' step ", s, " (model '", step.model_name, "')");
    const bool model_batching = model.max_batch_size() > 0;
    // Decoupled branching (Triton's check, same words): each response of a decoupled step is
    // its own flow (scheduling/ensemble_scheduler.h), so a step cannot join tensors that come
    // from two different decoupled steps: nothing says which response goes with which.
    int label = -1;
    for (const auto& b : step.inputs) {
      const int from = info[b.tensor].decoupled_from;
      if (from < 0) continue;
      if (label >= 0 && label != from) {
        return absl::InvalidArgumentError(inferd::StrCat(
            "in ensemble ", name, ", step of model '", step.model_name,
            "' receives inputs originated from different decoupled models (", where,
            " reads tensors that follow the responses of step ", label, " (model '",
            graph.steps[label].model_name, "') and of step ", from, " (model '",
            graph.steps[from].model_name, "'))"));
      }
      label = from;
    }
    const int outputs_from = model.model_transaction_policy().decoupled() ? static_cast<int>(s)
                                                                          : label;
    // A batching ensemble may run a step that does not batch (Triton's rule) where the full
    // shapes agree, which the shape checks below see: its dims are the batched tensor's full
    // shape (e.g. [-1, 16] for the [16] of a batching step), so the tensor reaches it whole, as
    // it is, and its output leaves as it is, as Triton's ensemble passes them. (Triton also
    // takes dims that agree only without the batch dimension, adding or removing a batch of 1
    // at run time; inferd refuses those here, naming the shapes.)
    if (batching && model_batching && model.max_batch_size() < ensemble.max_batch_size()) {
      return absl::InvalidArgumentError(inferd::StrCat(
          where, ": the ensemble allows max_batch_size ", ensemble.max_batch_size(),
          " but model '", step.model_name, "' allows only ", model.max_batch_size()));
    }
    for (const auto& b : step.inputs) {
      const inference::ModelInput* in = nullptr;
      for (const auto& i : model.input()) {
        if (i.name() == b.model_tensor) in = &i;
      }
      if (in == nullptr) {
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": input_map names input '", b.model_tensor, "', which model '",
            step.model_name, "' does not have (its inputs: ", Names(model.input()), ")"));
      }
      const TensorInfo& t = info[b.tensor];
      if (in->data_type() != t.type) {
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": input '", b.model_tensor, "' is ", config::ProtoTypeName(in->data_type()),
            " but tensor '", graph.tensors[b.tensor], "' (", t.source, ") is ",
            config::ProtoTypeName(t.type)));
      }
      auto shape = FullShape(*in, model_batching);
      if (shape && t.shape && !Compatible(*shape, *t.shape)) {
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": input '", b.model_tensor, "' has shape ", ShapeToString(*shape),
            " but tensor '", graph.tensors[b.tensor], "' (", t.source, ") has shape ",
            ShapeToString(*t.shape)));
      }
    }
    // Triton's rule: every input of the model is mapped, unless it is optional (the step then
    // runs without it).
    for (const auto& in : model.input()) {
      if (in.optional()) continue;
      bool mapped = false;
      for (const auto& b : step.inputs) mapped |= b.model_tensor == in.name();
      if (!mapped) {
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": input '", in.name(), "' of model '", step.model_name,
            "' is not mapped to any ensemble tensor (input_map; only an optional input may be "
            "left out)"));
      }
    }
    for (const auto& b : step.outputs) {
      const inference::ModelOutput* out = nullptr;
      for (const auto& o : model.output()) {
        if (o.name() == b.model_tensor) out = &o;
      }
      if (out == nullptr) {
        return absl::InvalidArgumentError(inferd::StrCat(
            where, ": output_map names output '", b.model_tensor, "', which model '",
            step.model_name, "' does not have (its outputs: ", Names(model.output()), ")"));
      }
      info[b.tensor] = {out->data_type(), FullShape(*out, model_batching),
                        inferd::StrCat("step ", s, " (model '", step.model_name, "') output '",
                                       b.model_tensor, "'"),
                        outputs_from};
    }
  }
  // The ensemble's responses join its outputs likewise (Triton names the ensemble as the step).
  int outputs_label = -1;
  for (int j = 0; j < ensemble.output_size(); ++j) {
    const int from = info[graph.outputs[j]].decoupled_from;
    if (from < 0) continue;
    if (outputs_label >= 0 && outputs_label != from) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "in ensemble ", name, ", step of model '", name,
          "' receives inputs originated from different decoupled models (the ensemble's output '",
          ensemble.output(j).name(), "' follows the responses of step ", from, " (model '",
          graph.steps[from].model_name, "'), another output those of step ", outputs_label,
          " (model '", graph.steps[outputs_label].model_name, "'))"));
    }
    outputs_label = from;
  }
  for (int j = 0; j < ensemble.output_size(); ++j) {
    const auto& out = ensemble.output(j);
    const TensorInfo& t = info[graph.outputs[j]];
    if (out.data_type() != t.type) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "ensemble '", name, "': output '", out.name(), "' is ",
          config::ProtoTypeName(out.data_type()), " but it is written by ", t.source, ", which is ",
          config::ProtoTypeName(t.type)));
    }
    auto shape = FullShape(out, batching);
    if (shape && t.shape && !Compatible(*shape, *t.shape)) {
      return absl::InvalidArgumentError(inferd::StrCat(
          "ensemble '", name, "': output '", out.name(), "' has shape ", ShapeToString(*shape),
          " but it is written by ", t.source, ", which has shape ", ShapeToString(*t.shape)));
    }
  }
  return absl::OkStatus();
}

}  // namespace inferd::repository
