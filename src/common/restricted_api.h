// Restricted protocols, as tritonserver's --http-restricted-api and --grpc-restricted-protocol
// define them: a group of API categories answers only requests that carry a given header (HTTP)
// or metadata key (gRPC) with a given value.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"

namespace inferd {

enum class ApiCategory {
  kHealth,
  kMetadata,
  kInference,
  kSharedMemory,
  kModelConfig,
  kModelRepository,
  kStatistics,
  kTrace,
  kLogging,
};
inline constexpr int kApiCategoryCount = 9;

// "model-repository"
std::string_view ApiCategoryName(ApiCategory category);

class ApiRestrictions {
 public:
  struct Rule {
    std::string key;
    std::string value;
  };

  // Adds one flag value, "<category>[,<category>...]:<key>=<value>". Errors name `flag`;
  // a category restricted twice is an error, as in tritonserver.
  absl::Status Add(std::string_view flag, std::string_view spec);

  // The rule a request of this category must satisfy; nullopt when the category is open.
  const std::optional<Rule>& Find(ApiCategory category) const {
    return rules_[static_cast<int>(category)];
  }
  bool empty() const;

  // The message a refused request gets.
  static std::string RefusalMessage(const Rule& rule);

 private:
  std::array<std::optional<Rule>, kApiCategoryCount> rules_;
};

}  // namespace inferd
