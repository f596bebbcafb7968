#include "metrics/prometheus.h"

#include <charconv>
#include <cmath>

#include "common/strings.h"

namespace inferd::metrics {
namespace {

void AppendEscaped(std::string* out, std::string_view v) {
  for (char c : v) {
    if (c == '\\' || c == '"') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

void PrometheusWriter::Family(std::string_view name, std::string_view help, std::string_view type) {
  StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void PrometheusWriter::Sample(std::string_view name, const Labels& labels, double value) {
  out_.append(name);
  if (!labels.empty()) {
    out_.push_back('{');
    for (size_t i = 0; i < labels.size(); ++i) {
      if (i) out_.push_back(',');
      StrAppend(&out_, labels[i].first, "=\"");
      AppendEscaped(&out_, labels[i].second);
      out_.push_back('"');
    }
    out_.push_back('}');
  }
  out_.push_back(' ');
  if (std::isnan(value)) {
    out_.append("NaN");
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    StrAppend(&out_, static_cast<int64_t>(value));
  } else {
    char buf[64];
    auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
    out_.append(buf, end);
  }
  out_.push_back('\n');
}

void MetricsRegistry::AddCollector(Collector collector) {
  inferd::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collector));
}

std::string MetricsRegistry::Render() const {
  PrometheusWriter w;
  inferd::MutexLock lock(&mu_);
  for (const auto& c : collectors_) c(w);
  return w.text();
}

}  // namespace inferd::metrics
