#include "tools/pack/pack_lib.h"

#include <archive.h>
#include <archive_entry.h>
#include <curl/curl.h>
#include <openssl/evp.h>
#include <strings.h>
#include <sys/stat.h>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>

#include "common/status_macros.h"
#include "common/strings.h"
#include "config/model_config_util.h"
#include "google/protobuf/util/message_differencer.h"
#include "repository/model_lifecycle.h"

namespace inferd::pack {

namespace fs = std::filesystem;
using inferd::StrCat;

namespace {

bool IsVersionName(const std::string& n) {
  return !n.empty() && std::all_of(n.begin(), n.end(), ::isdigit);
}

// A model folder: config.pbtxt, or a numeric version folder (a config to be auto-completed).
bool IsModelFolder(const fs::path& dir) {
  std::error_code ec;
  if (fs::exists(dir / "config.pbtxt", ec)) return true;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->is_directory(e2) && IsVersionName(it->path().filename().string())) return true;
  }
  return false;
}

absl::StatusOr<int64_t> ParseCount(const std::string& flag, const std::string& v, int64_t min,
                                   int64_t max) {
  int64_t n = 0;
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc() || end != v.data() + v.size() || n < min || n > max) {
    return absl::InvalidArgumentError(
        StrCat(flag, " takes an integer from ", min, " to ", max, ", got '", v, "'"));
  }
  return n;
}

}  // namespace

std::string PackUsage() {
  return R"(Usage: inferd-pack [options] <model folder | repository folder>

Packs a Triton model folder (or an ensemble and the models it runs, from one repository
folder) into the .tar.gz a SageMaker multi-model endpoint loads: the model folder at the
archive's top, or the ensemble and its parts side by side. The model is loaded first exactly as
inferd loads it (config, backend, auto-complete, instances, warmup); a model inferd would refuse
is refused with inferd's error, naming the file and the field. Each archive is then loaded back
as a SageMaker multi-model load would load it.

  -o, --output=<dir>          where the archives are written (default: .), as <name>.tar.gz
  --model=<name>              in a repository folder, the model to pack (default: the only
                              model, or the ensemble)
  --copies=<n>                write n archives (default 1), named by --name-prefix
  --name-prefix=<p>           archive i holds the model renamed <p><i> (folder and config.pbtxt
                              'name'); an ensemble's parts become <p><i>_<part>
  --upload=s3://bucket/prefix/   upload the archives there (AWS_ACCESS_KEY_ID,
                              AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION,
                              AWS_ENDPOINT_URL as inferd reads them)
  --disable-auto-complete-config   validate as inferd started with that flag
  --backend-directory=<dir>   where libinferd_backend_pytorch.so is (default: beside inferd-pack)
  -v, --verbose               show the server's log while validating
  -h, --help
)";
}

absl::StatusOr<PackOptions> ParsePackArgs(const std::vector<std::string>& args) {
  PackOptions o;
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::string value;
    bool has_value = false;
    if (a.rfind("--", 0) == 0) {
      if (size_t eq = a.find('='); eq != std::string::npos) {
        value = a.substr(eq + 1);
        a = a.substr(0, eq);
        has_value = true;
      }
    }
    auto take = [&]() -> absl::StatusOr<std::string> {
      if (has_value) return value;
      if (i + 1 >= args.size()) return absl::InvalidArgumentError(StrCat(a, " needs a value"));
      return args[++i];
    };
    if (a == "-h" || a == "--help") {
      o.help = true;
    } else if (a == "-v" || a == "--verbose") {
      o.verbose = true;
    } else if (a == "-o" || a == "--output") {
      ASSIGN_OR_RETURN(o.output_dir, take());
    } else if (a == "--model") {
      ASSIGN_OR_RETURN(o.model, take());
    } else if (a == "--copies") {
      ASSIGN_OR_RETURN(std::string v, take());
      ASSIGN_OR_RETURN(int64_t n, ParseCount("--copies", v, 1, 100000));
      o.copies = static_cast<int>(n);
    } else if (a == "--name-prefix") {
      ASSIGN_OR_RETURN(o.name_prefix, take());
    } else if (a == "--upload") {
      ASSIGN_OR_RETURN(o.upload, take());
    } else if (a == "--disable-auto-complete-config") {
      o.auto_complete = false;
    } else if (a == "--backend-directory") {
      ASSIGN_OR_RETURN(o.backend_directory, take());
    } else if (!a.empty() && a[0] == '-') {
      return absl::InvalidArgumentError(StrCat("unknown option '", args[i], "' (see --help)"));
    } else {
      positional.push_back(a);
    }
  }
  if (o.help) return o;
  if (positional.size() != 1) {
    return absl::InvalidArgumentError(
        "give one model folder or repository folder to pack (see --help)");
  }
  o.input = positional[0];
  if (o.copies > 1 && o.name_prefix.empty()) {
    return absl::InvalidArgumentError("--copies above 1 needs --name-prefix (the copies' names)");
  }
  if (!o.name_prefix.empty()) {
    // The longest name must be a valid model name, as inferd checks it.
    RETURN_IF_ERROR(repository::ValidateModelName(StrCat(o.name_prefix, o.copies - 1)));
  }
  if (!o.upload.empty() && o.upload.rfind("s3://", 0) != 0) {
    return absl::InvalidArgumentError(
        StrCat("--upload takes s3://bucket/prefix/, got '", o.upload, "'"));
  }
  return o;
}

absl::StatusOr<PackPlan> PlanPack(const std::string& input, const std::string& model) {
  std::error_code ec;
  if (!fs::is_directory(input, ec)) {
    return absl::InvalidArgumentError(StrCat("'", input, "' is not a folder"));
  }
  fs::path in = fs::absolute(input, ec).lexically_normal();
  if (in.has_filename() == false) in = in.parent_path();  // "dir/" -> "dir"
  PackPlan plan;
  if (IsModelFolder(in)) {
    plan.repository = in.parent_path().string();
    plan.model = in.filename().string();
    if (!model.empty() && model != plan.model) {
      return absl::InvalidArgumentError(StrCat("--model names '", model, "' but '", input,
                                               "' is the model folder '", plan.model, "'"));
    }
  } else {
    plan.repository = in.string();
    if (!model.empty()) {
      RETURN_IF_ERROR(repository::ValidateModelName(model));
      if (!fs::is_directory(in / model, ec)) {
        return absl::InvalidArgumentError(
            StrCat("--model: '", input, "' holds no model folder '", model, "'"));
      }
      plan.model = model;
    } else {
      // SageMaker's choice for an archive of this whole folder, made by the server's code.
      ASSIGN_OR_RETURN(std::string chosen, repository::ChooseModelFolder(in.string()));
      fs::path c(chosen);
      if (c.parent_path() != in) {
        return absl::InvalidArgumentError(StrCat(
            "'", input, "' is neither a model folder nor a folder of models; name the model ",
            "folder itself"));
      }
      plan.model = c.filename().string();
    }
  }
  RETURN_IF_ERROR(repository::ValidateModelName(plan.model));
  // An ensemble's composing models, from the same folder, recursively. A config that does not
  // parse is left to the validation, which reports it as the server does.
  std::vector<std::string> todo{plan.model};
  std::set<std::string> seen{plan.model};
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    const fs::path cfg_path = fs::path(plan.repository) / name / "config.pbtxt";
    if (!fs::exists(cfg_path, ec)) continue;
    auto cfg = config::ReadModelConfigFile(cfg_path.string());
    if (!cfg.ok() || !cfg->has_ensemble_scheduling()) continue;
    for (const auto& step : cfg->ensemble_scheduling().step()) {
      const std::string& part = step.model_name();
      if (part.empty() || seen.count(part) || !repository::ValidateModelName(part).ok()) continue;
      if (!fs::is_directory(fs::path(plan.repository) / part, ec)) continue;
      seen.insert(part);
      plan.parts.push_back(part);
      todo.push_back(part);
    }
  }
  return plan;
}

std::vector<std::string> ArchiveModelNames(const PackOptions& options, const std::string& model) {
  std::vector<std::string> names;
  if (options.name_prefix.empty()) {
    names.push_back(model);
  } else {
    for (int i = 0; i < options.copies; ++i) names.push_back(StrCat(options.name_prefix, i));
  }
  return names;
}

// ---- renaming inside config.pbtxt ------------------------------------------------------------

namespace {

// Just enough of protobuf's text format to find where a field's value is: identifiers,
// strings, punctuation, and everything else as opaque tokens. Comments run from '#' to the end
// of the line.
struct Token {
  enum Kind { kIdent, kString, kPunct, kOther } kind;
  size_t begin = 0, end = 0;  // [begin, end) in the text
  char punct = 0;
};

absl::StatusOr<std::vector<Token>> Tokenize(std::string_view s, std::string_view file_name) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (c == '#') {
      while (i < s.size() && s[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const size_t b = i++;
      while (i < s.size() && s[i] != c) {
        if (s[i] == '\n') break;
        i += s[i] == '\\' ? 2 : 1;
      }
      if (i >= s.size() || s[i] != c) {
        return absl::InvalidArgumentError(StrCat(file_name, ": unterminated string"));
      }
      ++i;
      out.push_back({Token::kString, b, i});
    } else if (isalpha(static_cast<unsigned char>(c)) || c == '_') {
      const size_t b = i;
      while (i < s.size() && (isalnum(static_cast<unsigned char>(s[i])) || s[i] == '_')) ++i;
      out.push_back({Token::kIdent, b, i});
    } else if (std::string_view("{}[]<>:,;").find(c) != std::string_view::npos) {
      out.push_back({Token::kPunct, i, i + 1, c});
      ++i;
    } else {
      const size_t b = i;
      while (i < s.size() && !isspace(static_cast<unsigned char>(s[i])) &&
             std::string_view("{}[]<>:,;#\"'").find(s[i]) == std::string_view::npos) {
        ++i;
      }
      out.push_back({Token::kOther, b, std::max(i, b + 1)});
      i = std::max(i, b + 1);
    }
  }
  return out;
}

// The value of a string token (the escapes text format allows in a model name).
std::string Unquote(std::string_view tok) {
  std::string out;
  for (size_t i = 1; i + 1 < tok.size(); ++i) {
    if (tok[i] == '\\' && i + 2 < tok.size()) {
      const char e = tok[++i];
      out += e == 'n' ? '\n' : e == 't' ? '\t' : e;
    } else {
      out += tok[i];
    }
  }
  return out;
}

std::string Quote(std::string_view v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

// Where a string-valued field sits: the enclosing message fields ("ensemble_scheduling.step")
// and its own name.
struct StringField {
  std::string path;
  std::string field;
  size_t begin = 0, end = 0;  // the value's span (adjacent strings included)
};

absl::StatusOr<std::vector<StringField>> FindStringFields(std::string_view text,
                                                          std::string_view file_name) {
  ASSIGN_OR_RETURN(std::vector<Token> toks, Tokenize(text, file_name));
  struct Frame {
    std::string field;  // empty for a list element
    bool list = false;
  };
  std::vector<Frame> stack;
  auto path = [&stack] {
    std::string p;
    for (const auto& f : stack) {
      if (f.field.empty()) continue;
      if (!p.empty()) p += '.';
      p += f.field;
    }
    return p;
  };
  auto is = [&toks](size_t k, char p) {
    return k < toks.size() && toks[k].kind == Token::kPunct && toks[k].punct == p;
  };
  std::vector<StringField> out;
  for (size_t k = 0; k < toks.size(); ++k) {
    const Token& t = toks[k];
    if (t.kind == Token::kPunct) {
      if ((t.punct == '{' || t.punct == '<') && !stack.empty() && stack.back().list) {
        stack.push_back({"", false});  // an element of a message list
      } else if (t.punct == '}' || t.punct == '>' || t.punct == ']') {
        if (stack.empty()) {
          return absl::InvalidArgumentError(StrCat(file_name, ": unbalanced '", t.punct, "'"));
        }
        stack.pop_back();
      }
      continue;
    }
    if (t.kind != Token::kIdent) continue;
    const std::string field(text.substr(t.begin, t.end - t.begin));
    size_t v = k + 1;
    if (is(v, ':')) ++v;
    else if (!is(v, '{') && !is(v, '<') && !is(v, '[')) continue;  // an enum value, not a field
    if (is(v, '{') || is(v, '<')) {
      stack.push_back({field, false});
      k = v;
    } else if (is(v, '[')) {
      stack.push_back({field, true});
      k = v;
    } else if (v < toks.size() && toks[v].kind == Token::kString) {
      size_t last = v;
      while (last + 1 < toks.size() && toks[last + 1].kind == Token::kString) ++last;
      out.push_back({path(), field, toks[v].begin, toks[last].end});
      k = last;
    }
  }
  if (!stack.empty()) {
    return absl::InvalidArgumentError(StrCat(file_name, ": '", stack.back().field, "' is not closed"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> RenameModelConfig(
    std::string_view text, std::string_view file_name, const std::string& new_name,
    const std::map<std::string, std::string>& step_renames) {
  // The original must parse (the server's parser, its error).
  ASSIGN_OR_RETURN(config::ModelConfig expected, config::ParseModelConfigText(text, file_name));
  expected.set_name(new_name);
  if (expected.has_ensemble_scheduling()) {
    for (auto& step : *expected.mutable_ensemble_scheduling()->mutable_step()) {
      if (auto it = step_renames.find(step.model_name()); it != step_renames.end()) {
        step.set_model_name(it->second);
      }
    }
  }
  ASSIGN_OR_RETURN(std::vector<StringField> fields, FindStringFields(text, file_name));
  struct Edit {
    size_t begin, end;
    std::string value;
  };
  std::vector<Edit> edits;
  bool has_name = false;
  for (const auto& f : fields) {
    if (f.path.empty() && f.field == "name") {
      has_name = true;
      edits.push_back({f.begin, f.end, Quote(new_name)});
    } else if (f.path == "ensemble_scheduling.step" && f.field == "model_name") {
      const std::string old = Unquote(text.substr(f.begin, f.end - f.begin));
      if (auto it = step_renames.find(old); it != step_renames.end()) {
        edits.push_back({f.begin, f.end, Quote(it->second)});
      }
    }
  }
  std::string out(text);
  std::sort(edits.begin(), edits.end(), [](const Edit& a, const Edit& b) { return a.begin > b.begin; });
  for (const auto& e : edits) out.replace(e.begin, e.end - e.begin, e.value);
  if (!has_name) out = StrCat("name: ", Quote(new_name), "\n", out);

  // The edit must change exactly the names: parse it again and compare.
  auto reparsed = config::ParseModelConfigText(out, file_name);
  std::string diff;
  if (reparsed.ok()) {
    google::protobuf::util::MessageDifferencer d;
    d.ReportDifferencesToString(&diff);
    if (d.Compare(expected, *reparsed)) return out;
  }
  return absl::InternalError(StrCat(
      file_name, ": renaming the model to '", new_name, "' did not give the expected config (",
      reparsed.ok() ? diff : std::string(reparsed.status().message()), ")"));
}

// ---- the archive -----------------------------------------------------------------------------

namespace {

struct ArchiveEntry {
  std::string name;  // path inside the archive
  fs::path source;   // empty for a directory or a generated file
  bool directory = false;
  bool executable = false;
  const std::string* content = nullptr;  // a generated config.pbtxt
};

absl::Status CollectEntries(const ArchiveMember& m, std::vector<ArchiveEntry>* out) {
  std::error_code ec;
  if (!fs::is_directory(m.source_dir, ec)) {
    return absl::InvalidArgumentError(StrCat("'", m.source_dir, "' is not a folder"));
  }
  out->push_back({m.name_in_archive + "/", {}, true});
  bool wrote_config = false;
  auto it = fs::recursive_directory_iterator(
      m.source_dir, fs::directory_options::follow_directory_symlink, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path rel = it->path().lexically_relative(m.source_dir);
    if (it->path().filename().string().rfind('.', 0) == 0) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it.depth() > 64) return absl::InvalidArgumentError(StrCat("'", m.source_dir, "' nests too deep (a link loop?)"));
    const std::string name = StrCat(m.name_in_archive, "/", rel.generic_string());
    std::error_code e2;
    const fs::file_status st = fs::status(it->path(), e2);  // follows links
    if (e2) {
      return absl::InvalidArgumentError(
          StrCat("cannot read '", it->path().string(), "': ", e2.message(), " (a dangling link?)"));
    }
    if (fs::is_directory(st)) {
      out->push_back({name + "/", {}, true});
    } else if (fs::is_regular_file(st)) {
      ArchiveEntry e{name, it->path(), false,
                     (st.permissions() & fs::perms::owner_exec) != fs::perms::none};
      if (m.config_text && rel == "config.pbtxt") {
        e.source.clear();
        e.content = &*m.config_text;
        wrote_config = true;
      }
      out->push_back(std::move(e));
    } else {
      return absl::InvalidArgumentError(StrCat(
          "'", it->path().string(), "' is not a file or a folder (sockets, devices and FIFOs "
          "cannot go into a model archive)"));
    }
  }
  if (ec) return absl::InvalidArgumentError(StrCat("cannot read '", m.source_dir, "': ", ec.message()));
  if (m.config_text && !wrote_config) {
    out->push_back({StrCat(m.name_in_archive, "/config.pbtxt"), {}, false, false, &*m.config_text});
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> WriteModelArchive(const std::vector<ArchiveMember>& members,
                                          const std::string& path) {
  std::vector<ArchiveEntry> entries;
  for (const auto& m : members) RETURN_IF_ERROR(CollectEntries(m, &entries));
  std::sort(entries.begin(), entries.end(),
            [](const ArchiveEntry& a, const ArchiveEntry& b) { return a.name < b.name; });

  const std::string tmp = StrCat(path, ".partial");
  std::unique_ptr<archive, int (*)(archive*)> a(archive_write_new(), archive_write_free);
  auto fail = [&](std::string_view what) {
    std::string why = archive_error_string(a.get()) ? archive_error_string(a.get()) : "";
    std::error_code ec;
    a.reset();
    fs::remove(tmp, ec);
    return absl::InternalError(StrCat("writing '", path, "': ", what, why.empty() ? "" : ": ", why));
  };
  if (archive_write_add_filter_gzip(a.get()) != ARCHIVE_OK ||
      archive_write_set_filter_option(a.get(), "gzip", "timestamp", nullptr) != ARCHIVE_OK ||
      archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK) {
    return fail("cannot set up gzip and tar");
  }
  if (archive_write_open_filename(a.get(), tmp.c_str()) != ARCHIVE_OK) return fail("cannot create");
  int64_t files = 0;
  std::vector<char> buf(1 << 20);
  for (const auto& e : entries) {
    std::unique_ptr<archive_entry, void (*)(archive_entry*)> h(archive_entry_new(), archive_entry_free);
    archive_entry_set_pathname(h.get(), e.name.c_str());
    archive_entry_set_uid(h.get(), 0);
    archive_entry_set_gid(h.get(), 0);
    archive_entry_set_uname(h.get(), "root");
    archive_entry_set_gname(h.get(), "root");
    archive_entry_set_mtime(h.get(), 0, 0);
    if (e.directory) {
      archive_entry_set_filetype(h.get(), AE_IFDIR);
      archive_entry_set_perm(h.get(), 0755);
      if (archive_write_header(a.get(), h.get()) != ARCHIVE_OK) return fail(e.name);
      continue;
    }
    archive_entry_set_filetype(h.get(), AE_IFREG);
    archive_entry_set_perm(h.get(), e.executable ? 0755 : 0644);
    ++files;
    if (e.content != nullptr) {
      archive_entry_set_size(h.get(), static_cast<la_int64_t>(e.content->size()));
      if (archive_write_header(a.get(), h.get()) != ARCHIVE_OK) return fail(e.name);
      if (archive_write_data(a.get(), e.content->data(), e.content->size()) < 0) return fail(e.name);
      continue;
    }
    std::ifstream in(e.source, std::ios::binary);
    std::error_code ec;
    const auto size = fs::file_size(e.source, ec);
    if (!in || ec) return fail(StrCat("cannot read '", e.source.string(), "'"));
    archive_entry_set_size(h.get(), static_cast<la_int64_t>(size));
    if (archive_write_header(a.get(), h.get()) != ARCHIVE_OK) return fail(e.name);
    uintmax_t left = size;
    while (left > 0) {
      in.read(buf.data(), static_cast<std::streamsize>(std::min<uintmax_t>(buf.size(), left)));
      const std::streamsize n = in.gcount();
      if (n <= 0) return fail(StrCat("'", e.source.string(), "' changed while it was packed"));
      if (archive_write_data(a.get(), buf.data(), static_cast<size_t>(n)) < 0) return fail(e.name);
      left -= static_cast<uintmax_t>(n);
    }
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK) return fail("cannot finish");
  a.reset();
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(StrCat("cannot rename '", tmp, "' to '", path, "': ", ec.message()));
  return files;
}

// ---- S3 upload -------------------------------------------------------------------------------

absl::StatusOr<repository::S3Location> UploadLocation(std::string_view url,
                                                      std::string_view file_name,
                                                      repository::S3Config* config) {
  ASSIGN_OR_RETURN(repository::S3RepositoryUrl u, repository::ParseS3RepositoryUrl(url));
  if (!u.endpoint.empty()) config->endpoint = u.endpoint;
  return repository::S3Location{u.bucket, StrCat(u.prefix, file_name)};
}

namespace {

absl::Status Digests(const std::string& path, std::string* sha256_hex, std::string* md5_base64) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(StrCat("cannot open '", path, "'"));
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> sha(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> md5(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(sha.get(), EVP_sha256(), nullptr);
  EVP_DigestInit_ex(md5.get(), EVP_md5(), nullptr);
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    if (in.gcount() > 0) {
      EVP_DigestUpdate(sha.get(), buf.data(), static_cast<size_t>(in.gcount()));
      EVP_DigestUpdate(md5.get(), buf.data(), static_cast<size_t>(in.gcount()));
    }
  }
  unsigned char d[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(sha.get(), d, &n);
  static const char* kHex = "0123456789abcdef";
  sha256_hex->clear();
  for (unsigned int i = 0; i < n; ++i) {
    *sha256_hex += kHex[d[i] >> 4];
    *sha256_hex += kHex[d[i] & 15];
  }
  if (md5_base64 != nullptr) {
    EVP_DigestFinal_ex(md5.get(), d, &n);
    unsigned char b64[64];
    const int len = EVP_EncodeBlock(b64, d, static_cast<int>(n));
    md5_base64->assign(reinterpret_cast<char*>(b64), static_cast<size_t>(len));
  }
  return absl::OkStatus();
}

std::string XmlText(std::string_view xml, std::string_view tag) {
  const std::string open = StrCat("<", tag, ">"), close = StrCat("</", tag, ">");
  const size_t b = xml.find(open);
  if (b == std::string_view::npos) return "";
  const size_t e = xml.find(close, b);
  if (e == std::string_view::npos) return "";
  return std::string(xml.substr(b + open.size(), e - b - open.size()));
}

size_t OnBody(char* p, size_t size, size_t n, void* body) {
  auto* s = static_cast<std::string*>(body);
  if (s->size() < 65536) s->append(p, size * n);
  return size * n;
}

size_t OnHeader(char* p, size_t size, size_t n, void* etag) {
  std::string_view line(p, size * n);
  if (line.size() > 5 && strncasecmp(line.data(), "etag:", 5) == 0) {
    std::string v(line.substr(5));
    v.erase(std::remove_if(v.begin(), v.end(), [](char c) { return c == '"' || isspace(static_cast<unsigned char>(c)); }), v.end());
    *static_cast<std::string*>(etag) = v;
  }
  return size * n;
}

}  // namespace

absl::StatusOr<std::string> FileSha256(const std::string& path) {
  std::string hex;
  RETURN_IF_ERROR(Digests(path, &hex, nullptr));
  return hex;
}

absl::StatusOr<UploadResult> UploadToS3(const repository::S3Config& config,
                                        const repository::S3Location& location,
                                        const std::string& path) {
  const std::string what = StrCat("s3://", location.bucket, "/", location.key);
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec) return absl::NotFoundError(StrCat("cannot read '", path, "': ", ec.message()));
  if (size > (uint64_t{5} << 30)) {
    return absl::InvalidArgumentError(StrCat(
        "'", path, "' is ", size, " bytes, above S3's 5 GiB limit for one PUT (multipart upload "
        "is not implemented); upload it with the AWS CLI"));
  }
  std::string sha256, md5;
  RETURN_IF_ERROR(Digests(path, &sha256, &md5));
  std::unique_ptr<FILE, int (*)(FILE*)> file(fopen(path.c_str(), "rb"), fclose);
  if (!file) return absl::NotFoundError(StrCat("cannot open '", path, "'"));

  std::unique_ptr<CURL, void (*)(CURL*)> c(curl_easy_init(), curl_easy_cleanup);
  if (!c) return absl::InternalError("curl_easy_init failed");
  curl_slist* headers = nullptr;
  headers = curl_slist_append(headers, StrCat("x-amz-content-sha256: ", sha256).c_str());
  headers = curl_slist_append(headers, StrCat("Content-MD5: ", md5).c_str());
  headers = curl_slist_append(headers, "Content-Type: application/gzip");
  headers = curl_slist_append(headers, "Expect:");  // s3rver and some proxies mishandle 100-continue
  if (!config.session_token.empty()) {
    headers = curl_slist_append(headers, StrCat("x-amz-security-token: ", config.session_token).c_str());
  }
  std::unique_ptr<curl_slist, void (*)(curl_slist*)> header_guard(headers, curl_slist_free_all);
  const std::string url = repository::S3ObjectUrl(config, location);
  std::string body, etag;
  char error[CURL_ERROR_SIZE] = "";
  CURL* h = c.get();
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
  curl_easy_setopt(h, CURLOPT_READDATA, file.get());
  curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(h, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, config.transfer.connect_timeout_s);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, config.transfer.low_speed_bytes);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, config.transfer.low_speed_seconds);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, OnBody);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, OnHeader);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &etag);
  const std::string sigv4 = StrCat("aws:amz:", config.region, ":s3");
  const std::string userpwd = StrCat(config.access_key, ":", config.secret_key);
  if (!config.access_key.empty()) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERPWD, userpwd.c_str());
  }
  const CURLcode rc = curl_easy_perform(h);
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(StrCat("uploading ", what, ": ", curl_easy_strerror(rc),
                                         *error ? StrCat(": ", error) : ""));
  }
  if (status != 200) {
    const std::string code = XmlText(body, "Code"), message = XmlText(body, "Message");
    const std::string detail = StrCat("HTTP ", status, code.empty() ? "" : " ", code,
                                      message.empty() ? "" : ": ", message);
    if (status == 401 || status == 403) {
      return absl::PermissionDeniedError(StrCat("uploading ", what, ": access denied (", detail, ")"));
    }
    if (status == 404) {
      return absl::NotFoundError(StrCat("uploading ", what, ": no such bucket (", detail, ")"));
    }
    return absl::UnavailableError(StrCat("uploading ", what, " failed (", detail, ")"));
  }
  return UploadResult{etag, static_cast<int64_t>(size)};
}

}  // namespace inferd::pack
