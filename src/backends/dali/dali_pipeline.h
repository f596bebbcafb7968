// The reader of DALI's serialized pipelines (`model.dali`: the PipelineDef protobuf that DALI's
// `Pipeline.serialize()` writes). It turns the bytes into a graph of operator nodes with typed
// arguments, read the way DALI's DeserializeOpSpec reads them, and checks the graph's shape:
// every input named before use, one output per operator, the pipeline's outputs known. Whether
// inferd runs each operator (and its arguments) is dali_ops.h's business.
//
// Pure functions of their input; thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data_type.h"

namespace inferd::backends::dali {

// DALI's DALIDataType numbering (the values `dtype` arguments and InputOutput.dtype carry).
enum class DaliType : int {
  kNoType = -1,
  kUint8 = 0,
  kUint16 = 1,
  kUint32 = 2,
  kUint64 = 3,
  kInt8 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kFloat16 = 8,
  kFloat = 9,
  kFloat64 = 10,
  kBool = 11,
};

// kNoType for a number that is not one of the types above.
DaliType DaliTypeFromInt(int64_t value);
std::string_view DaliTypeName(DaliType type);  // "UINT8", "FLOAT", ...
DataType ToDataType(DaliType type);            // kInvalid for kNoType
DaliType FromDataType(DataType type);          // kNoType where DALI has no such type
bool IsFloat(DaliType type);

// One argument as serialized: scalars hold one value, lists (is_vector) any number.
struct ArgValue {
  std::string type;  // "int64", "float", "string", "bool"
  bool is_vector = false;
  std::vector<double> numbers;  // int64, float and bool values
  std::vector<std::string> strings;
};

// One operator of the graph. `op` is the schema name DALI serialized ("Resize",
// "decoders__Image", "ArithmeticGenericOp", ...).
struct OpNode {
  std::string op;
  std::string instance;  // inst_name, for messages
  std::string device;    // "cpu", "gpu" or "mixed"
  std::vector<std::string> inputs;  // edge names of the regular inputs, in order
  std::string output;               // edge name of its one output
  std::map<std::string, ArgValue, std::less<>> args;

  // "operator 'Resize' (__Resize_2)", for messages.
  std::string Label() const;

  bool Has(std::string_view name) const { return args.contains(name); }
  // Typed reads. A missing argument gives the default; a value of the wrong kind is
  // INVALID_ARGUMENT naming the operator and the argument.
  absl::StatusOr<double> Number(std::string_view name, double fallback) const;
  absl::StatusOr<std::vector<double>> Numbers(std::string_view name) const;  // scalar -> 1 element
  absl::StatusOr<std::string> String(std::string_view name, std::string_view fallback) const;
  absl::StatusOr<bool> Bool(std::string_view name, bool fallback) const;
};

// An ExternalSource: a pipeline input, fed from the request input of the same name.
struct ExternalInput {
  std::string name;
  std::string edge;
  DaliType dtype = DaliType::kNoType;  // from its `dtype` argument, when set
  int ndim = -1;                       // from its `ndim` argument, when set
};

struct PipelineGraph {
  int batch_size = 0;   // the pipeline's max batch size
  int num_threads = 0;
  int device_id = 0;
  std::vector<OpNode> ops;  // in serialization order, which is a topological order
  std::vector<ExternalInput> inputs;
  std::vector<std::string> outputs;  // edge names of the pipeline's outputs, in order
};

// Parses and checks `bytes`. Errors are INVALID_ARGUMENT and say what in the file is wrong.
absl::StatusOr<PipelineGraph> ParsePipeline(std::string_view bytes);

}  // namespace inferd::backends::dali
