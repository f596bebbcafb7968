#include "repository/repository_index.h"

#include "common/logging.h"
#include "common/strings.h"
#include "repository/model.h"

namespace inferd::repository {

absl::Status RepositoryIndex::Open(const std::vector<std::string>& urls,
                                   const SourceOptions& options) {
  std::vector<std::string> errors;
  for (const auto& url : urls) {
    auto source = OpenSource(url, options);
    if (!source.ok()) {
      errors.push_back(std::string(source.status().message()));
      continue;
    }
    if ((*source)->remote()) {
      // Reachable, and the bucket exists: an unreachable repository fails the start.
      auto listed = (*source)->List();
      if (!listed.ok()) {
        errors.push_back(std::string(listed.status().message()));
        continue;
      }
      LOG_INFO << "model repository " << url << ": " << listed->size() << " models";
    }
    sources_.push_back(*std::move(source));
  }
  if (errors.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(StrJoin(errors, "; "));
}

RepositoryIndex::Scan RepositoryIndex::List() const {
  Scan scan;
  std::vector<std::pair<Source*, std::vector<SourceModel>>> lists;
  for (const auto& source : sources_) {
    auto listed = source->List();
    if (!listed.ok()) {
      LOG_WARNING << "cannot list " << source->url() << ": " << listed.status().message();
      scan.errors.push_back(std::string(listed.status().message()));
      continue;
    }
    lists.emplace_back(source.get(), *std::move(listed));
  }
  for (const auto& [source, models] : lists) {
    for (const auto& m : models) {
      auto [it, inserted] = scan.models.emplace(m.name, Listed{source, m});
      if (!inserted) {
        // Triton's reason (MODEL_READY_REASON_DUPLICATE), then where.
        scan.duplicates[m.name] =
            StrCat("model appears in two or more repositories: '", m.name, "' in '",
                   it->second.source->url(), "' and '", source->url(),
                   "' (--model-namespacing=true serves each)");
      }
    }
  }
  for (const auto& [name, reason] : scan.duplicates) scan.models.erase(name);
  if (namespacing_) {
    // Each repository's copy of a shared name is its own model, keyed by its namespace.
    for (const auto& [source, models] : lists) {
      for (const auto& m : models) {
        if (scan.duplicates.count(m.name)) {
          scan.models.emplace(NamespacedName(source->url(), m.name), Listed{source, m});
        }
      }
    }
    scan.duplicates.clear();
  }
  return scan;
}

std::string RepositoryIndex::PlainName(const std::string& key) const {
  if (!namespacing_) return key;
  for (const auto& source : sources_) {
    const std::string prefix = StrCat(source->url(), "::");
    if (key.size() > prefix.size() && key.compare(0, prefix.size(), prefix) == 0) {
      return key.substr(prefix.size());
    }
  }
  return key;
}

size_t RepositoryIndex::CopiesOf(const Scan& scan, std::string_view name) const {
  size_t copies = 0;
  for (const auto& source : sources_) copies += scan.models.count(NamespacedName(source->url(), name));
  return copies;
}

RepositoryIndex::Diff RepositoryIndex::Compare(
    const Scan& scan, const std::map<std::string, Held, std::less<>>& held) const {
  Diff diff;
  for (const auto& [name, h] : held) {
    if (h.removable && !scan.models.count(name)) diff.removed.push_back(name);
  }
  for (const auto& [name, listed] : scan.models) {
    if (listed.model.archive) continue;
    auto it = held.find(name);
    if (it == held.end() || it->second.source_fingerprint != listed.model.fingerprint) {
      diff.changed[name] = listed;
    }
  }
  if (!namespacing_) return diff;
  std::set<std::string> rekeyed;
  for (const auto& name : diff.removed) rekeyed.insert(PlainName(name));
  for (const auto& [name, listed] : diff.changed) {
    if (!held.count(name)) rekeyed.insert(listed.model.name);
  }
  if (rekeyed.empty()) return diff;
  for (const auto& [name, h] : held) {
    auto listed = scan.models.find(name);
    if (diff.changed.count(name) || listed == scan.models.end()) continue;
    for (const auto& step : h.steps) {
      if (rekeyed.count(PlainName(step))) {
        diff.changed[name] = listed->second;
        break;
      }
    }
  }
  return diff;
}

}  // namespace inferd::repository
