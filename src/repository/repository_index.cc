#include "repository/repository_index.h"

#include <filesystem>

#include "common/logging.h"
#include "common/strings.h"
#include "repository/model.h"

namespace inferd::repository {

absl::Status UnknownModelError(std::string_view name, int64_t version, std::string_view detail) {
  std::string message = StrCat("Request for unknown model: '", name, "'");
  if (version >= 0) message += StrCat(" version ", version);
  message += " is not found";
  if (!detail.empty()) message += StrCat(" (", detail, ")");
  return absl::NotFoundError(message);
}

namespace fs = std::filesystem;

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

absl::StatusOr<RepositoryIndex::Located> RepositoryIndex::Locate(const std::string& source_name,
                                                                FetchFn fetch) const {
  for (const auto& source : sources_) {
    Located found;
    auto dir = fetch(source.get(), source_name, &found.fetch);
    if (!dir.ok() && dir.status().code() == absl::StatusCode::kNotFound) continue;
    if (!dir.ok()) return dir.status();
    found.source = source.get();
    found.source_name = source_name;
    found.dir = *dir;
    return found;
  }
  std::vector<std::string> urls;
  for (const auto& s : sources_) urls.push_back(s->url());
  return UnknownModelError(source_name, -1,
                           StrCat("no model repository (", StrJoin(urls, ", "), ") holds it"));
}

absl::StatusOr<RepositoryIndex::Located> RepositoryIndex::LocateUrl(const std::string& url,
                                                                   const SourceOptions& options,
                                                                   FetchFn fetch) {
  Located found;
  if (url.rfind("s3://", 0) != 0) {
    std::error_code ec;
    if (!fs::exists(url, ec)) {
      return absl::InvalidArgumentError(StrCat("'url' ", url, " does not exist"));
    }
    if (fs::is_directory(url, ec)) {
      found.dir = url;
      return found;
    }
    if (!IsArchiveName(url)) {
      return absl::InvalidArgumentError(
          StrCat("'url' ", url, " is a file but not a .tar.gz, .tgz or .tar archive"));
    }
  }
  if (url.rfind("s3://", 0) == 0) {
    const std::string_view rest = std::string_view(url).substr(5);
    const size_t slash = rest.find('/');
    if (slash == std::string_view::npos || slash == 0 || slash + 1 >= rest.size()) {
      return absl::InvalidArgumentError(StrCat("'url' ", url, " must be s3://<bucket>/<key>"));
    }
  }
  // An archive or an S3 object: fetched through a source for its parent folder or prefix.
  std::string parent = url;
  while (!parent.empty() && parent.back() == '/') parent.pop_back();
  const size_t slash = parent.rfind('/');
  if (slash == std::string::npos || slash + 1 >= parent.size()) {
    return absl::InvalidArgumentError(StrCat("'url' ", url, " names no model"));
  }
  const std::string leaf = parent.substr(slash + 1);
  parent = parent.substr(0, slash);
  if (parent.empty()) parent = "/";
  auto source = OpenSource(parent, options);
  if (!source.ok()) return source.status();
  auto dir = fetch(source->get(), leaf, &found.fetch);
  if (!dir.ok()) {
    // The caller's URL is wrong (missing object, denied): a client error naming it.
    if (dir.status().code() == absl::StatusCode::kNotFound ||
        dir.status().code() == absl::StatusCode::kPermissionDenied) {
      return absl::InvalidArgumentError(dir.status().message());
    }
    return dir.status();
  }
  found.dir = *dir;
  return found;
}

}  // namespace inferd::repository
