#include "common/restricted_api.h"

#include <algorithm>
#include <vector>

#include "common/strings.h"

namespace inferd {
namespace {

constexpr std::array<std::string_view, kApiCategoryCount> kNames = {
    "health",           "metadata",   "inference", "shared-memory", "model-config",
    "model-repository", "statistics", "trace",     "logging"};

}  // namespace

std::string_view ApiCategoryName(ApiCategory category) {
  return kNames[static_cast<int>(category)];
}

absl::Status ApiRestrictions::Add(std::string_view flag, std::string_view spec) {
  const size_t colon = spec.find(':');
  const size_t eq = colon == std::string_view::npos ? colon : spec.find('=', colon);
  if (colon == std::string_view::npos || eq == std::string_view::npos || colon == 0 ||
      eq == colon + 1) {
    return absl::InvalidArgumentError(
        StrCat("--", flag, " takes <category>[,<category>...]:<key>=<value>, got '", spec, "'"));
  }
  Rule rule{std::string(spec.substr(colon + 1, eq - colon - 1)), std::string(spec.substr(eq + 1))};
  std::vector<int> categories;
  std::string_view list = spec.substr(0, colon);
  while (!list.empty()) {
    const size_t comma = list.find(',');
    std::string_view name = list.substr(0, comma);
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    auto it = std::find(kNames.begin(), kNames.end(), name);
    if (it == kNames.end()) {
      return absl::InvalidArgumentError(StrCat("--", flag, ": unknown category '", name,
                                               "'; known: ", StrJoin(kNames, ", ")));
    }
    const int index = static_cast<int>(it - kNames.begin());
    if (rules_[index]) {
      return absl::InvalidArgumentError(
          StrCat("--", flag, ": category '", name, "' is restricted more than once"));
    }
    categories.push_back(index);
  }
  for (int index : categories) rules_[index] = rule;
  return absl::OkStatus();
}

bool ApiRestrictions::empty() const {
  return std::none_of(rules_.begin(), rules_.end(), [](const auto& r) { return r.has_value(); });
}

std::string ApiRestrictions::RefusalMessage(const Rule& rule) {
  return StrCat("This API is restricted, expecting header '", rule.key, "'");
}

}  // namespace inferd
