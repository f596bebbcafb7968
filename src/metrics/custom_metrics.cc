#include "metrics/custom_metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

#include "common/strings.h"

namespace inferd::metrics {
namespace {

bool ValidName(std::string_view name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

const char* KindName(CustomKind kind) {
  switch (kind) {
    case CustomKind::kCounter: return "counter";
    case CustomKind::kGauge: return "gauge";
    case CustomKind::kHistogram: return "histogram";
  }
  return "unknown";
}

// A bucket bound as prometheus-cpp writes it in `le`: "1" for 1.0, "2.5", "+Inf".
std::string FormatBound(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return StrCat(static_cast<int64_t>(v));
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, end);
}

}  // namespace

CustomMetrics::CustomMetrics(MetricsRegistry* registry) {
  if (registry != nullptr) registry->AddCollector([this](PrometheusWriter& w) { Render(w); });
}

absl::StatusOr<uint64_t> CustomMetrics::NewFamily(std::string_view name,
                                                  std::string_view description, int kind) {
  if (!ValidName(name, /*allow_colon=*/true)) {
    return absl::InvalidArgumentError(StrCat(
        "metric family name '", name, "' is not a valid Prometheus metric name ([a-zA-Z_:]"
        "[a-zA-Z0-9_:]*)"));
  }
  if (kind < 0 || kind > 2) {
    return absl::InvalidArgumentError(StrCat("metric family '", name, "': unknown kind ", kind,
                                             " (COUNTER 0, GAUGE 1, HISTOGRAM 2)"));
  }
  const auto k = static_cast<CustomKind>(kind);
  inferd::MutexLock lock(&mu_);
  Family* family = nullptr;
  for (const auto& f : families_) {
    if (f->name == name) family = f.get();
  }
  if (family != nullptr && family->kind != k) {
    return absl::InvalidArgumentError(StrCat(
        "metric family '", name, "' already exists as a ", KindName(family->kind),
        "; it cannot be added as a ", KindName(k)));
  }
  if (family == nullptr) {
    auto f = std::make_unique<Family>();
    f->name = std::string(name);
    f->description = std::string(description);
    f->kind = k;
    family = f.get();
    families_.push_back(std::move(f));
  }
  ++family->refs;
  const uint64_t id = next_id_++;
  family_handles_[id] = family;
  return id;
}

absl::StatusOr<uint64_t> CustomMetrics::NewMetric(uint64_t family_id, Labels labels,
                                                  std::optional<std::vector<double>> buckets) {
  inferd::MutexLock lock(&mu_);
  auto it = family_handles_.find(family_id);
  if (it == family_handles_.end()) {
    return absl::NotFoundError(StrCat("no metric family with handle ", family_id));
  }
  Family* family = it->second;
  std::sort(labels.begin(), labels.end());
  for (size_t i = 0; i < labels.size(); ++i) {
    const std::string& key = labels[i].first;
    if (!ValidName(key, /*allow_colon=*/false) || key.rfind("__", 0) == 0) {
      return absl::InvalidArgumentError(StrCat("metric family '", family->name, "': label '", key,
                                               "' is not a valid Prometheus label name"));
    }
    if (i > 0 && labels[i - 1].first == key) {
      return absl::InvalidArgumentError(
          StrCat("metric family '", family->name, "': label '", key, "' is given twice"));
    }
    if (family->kind == CustomKind::kHistogram && key == "le") {
      return absl::InvalidArgumentError(StrCat(
          "metric family '", family->name, "': a histogram's label cannot be named 'le'"));
    }
  }
  if (family->kind == CustomKind::kHistogram) {
    if (!buckets.has_value()) {
      return absl::InvalidArgumentError(StrCat("metric family '", family->name,
                                               "': a histogram metric needs buckets"));
    }
    for (size_t i = 0; i < buckets->size(); ++i) {
      if (std::isnan((*buckets)[i]) || (i > 0 && (*buckets)[i] <= (*buckets)[i - 1])) {
        return absl::InvalidArgumentError(StrCat(
            "metric family '", family->name,
            "': histogram buckets must be strictly increasing numbers"));
      }
    }
  } else if (buckets.has_value()) {
    return absl::InvalidArgumentError(StrCat("metric family '", family->name, "' is a ",
                                             KindName(family->kind),
                                             "; only a histogram metric takes buckets"));
  }
  auto& slot = family->series[labels];
  if (slot == nullptr) {
    slot = std::make_unique<Series>();
    slot->labels = labels;
    if (buckets.has_value()) {
      slot->buckets = std::move(*buckets);
      slot->bucket_counts.assign(slot->buckets.size() + 1, 0);
    }
  }
  ++slot->refs;
  ++family->refs;
  const uint64_t id = next_id_++;
  metric_handles_[id] = MetricHandle{family, slot.get()};
  return id;
}

void CustomMetrics::Unref(Family* family) {
  if (--family->refs > 0) return;
  families_.erase(std::remove_if(families_.begin(), families_.end(),
                                 [&](const auto& f) { return f.get() == family; }),
                  families_.end());
}

void CustomMetrics::ReleaseFamily(uint64_t family_id) {
  inferd::MutexLock lock(&mu_);
  auto it = family_handles_.find(family_id);
  if (it == family_handles_.end()) return;
  Family* family = it->second;
  family_handles_.erase(it);
  Unref(family);
}

void CustomMetrics::ReleaseMetric(uint64_t metric_id) {
  inferd::MutexLock lock(&mu_);
  auto it = metric_handles_.find(metric_id);
  if (it == metric_handles_.end()) return;
  auto [family, series] = it->second;
  metric_handles_.erase(it);
  if (--series->refs == 0) family->series.erase(series->labels);
  Unref(family);
}

absl::StatusOr<CustomMetrics::MetricHandle> CustomMetrics::Find(uint64_t metric) const {
  auto it = metric_handles_.find(metric);
  if (it == metric_handles_.end()) {
    return absl::NotFoundError(StrCat("no metric with handle ", metric));
  }
  return it->second;
}

absl::Status CustomMetrics::Increment(uint64_t metric, double value) {
  inferd::MutexLock lock(&mu_);
  auto h = Find(metric);
  if (!h.ok()) return h.status();
  switch (h->family->kind) {
    case CustomKind::kCounter:
      if (value < 0) {
        return absl::FailedPreconditionError(StrCat(
            "metric '", h->family->name, "' is a counter; it cannot be incremented by a "
            "negative value (", value, ")"));
      }
      break;
    case CustomKind::kGauge:
      break;
    case CustomKind::kHistogram:
      return absl::FailedPreconditionError(StrCat(
          "metric '", h->family->name, "' is a histogram; it takes only observe()"));
  }
  h->series->value += value;
  return absl::OkStatus();
}

absl::Status CustomMetrics::Set(uint64_t metric, double value) {
  inferd::MutexLock lock(&mu_);
  auto h = Find(metric);
  if (!h.ok()) return h.status();
  if (h->family->kind != CustomKind::kGauge) {
    return absl::FailedPreconditionError(StrCat("metric '", h->family->name, "' is a ",
                                                KindName(h->family->kind),
                                                "; only a gauge takes set()"));
  }
  h->series->value = value;
  return absl::OkStatus();
}

absl::Status CustomMetrics::Observe(uint64_t metric, double value) {
  inferd::MutexLock lock(&mu_);
  auto h = Find(metric);
  if (!h.ok()) return h.status();
  if (h->family->kind != CustomKind::kHistogram) {
    return absl::FailedPreconditionError(StrCat("metric '", h->family->name, "' is a ",
                                                KindName(h->family->kind),
                                                "; only a histogram takes observe()"));
  }
  Series& s = *h->series;
  // The first bucket whose upper bound holds the value (Prometheus buckets are "le").
  const size_t b = static_cast<size_t>(
      std::lower_bound(s.buckets.begin(), s.buckets.end(), value) - s.buckets.begin());
  ++s.bucket_counts[b];
  ++s.count;
  s.value += value;
  return absl::OkStatus();
}

absl::StatusOr<double> CustomMetrics::Value(uint64_t metric) const {
  inferd::MutexLock lock(&mu_);
  auto h = Find(metric);
  if (!h.ok()) return h.status();
  if (h->family->kind == CustomKind::kHistogram) {
    return absl::FailedPreconditionError(StrCat(
        "metric '", h->family->name, "' is a histogram; it has no single value"));
  }
  return h->series->value;
}

void CustomMetrics::Render(PrometheusWriter& w) const {
  inferd::MutexLock lock(&mu_);
  for (const auto& f : families_) {
    w.Family(f->name, f->description, KindName(f->kind));
    for (const auto& [labels, s] : f->series) {
      if (f->kind != CustomKind::kHistogram) {
        w.Sample(f->name, labels, s->value);
        continue;
      }
      w.Sample(StrCat(f->name, "_count"), labels, static_cast<double>(s->count));
      w.Sample(StrCat(f->name, "_sum"), labels, s->value);
      uint64_t cumulative = 0;
      for (size_t b = 0; b < s->bucket_counts.size(); ++b) {
        cumulative += s->bucket_counts[b];
        Labels l = labels;
        l.emplace_back("le", b < s->buckets.size() ? FormatBound(s->buckets[b]) : "+Inf");
        w.Sample(StrCat(f->name, "_bucket"), l, static_cast<double>(cumulative));
      }
    }
  }
}

}  // namespace inferd::metrics
