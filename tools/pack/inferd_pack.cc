// inferd-pack: validates a model (or an ensemble and its parts) by loading it in-process with
// the server's own code, then writes the SageMaker-ready .tar.gz archive(s), loads each archive
// back as a SageMaker multi-model load would, and optionally uploads them to S3.
//
// Validation is the server itself: a server::Server in explicit mode over a scratch
// repository of links to the model folders, asked to load the model (config parse,
// platform/backend, auto-complete from the model file, instance creation, warmup; for an
// ensemble its graph and the composing models from the same folder). Its error is the one
// `inferd` would log and answer, with the scratch paths mapped back to the user's.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <regex>
#include <sstream>
#include <thread>

#include "backends/backend.h"
#include "backends/identity/identity_backend.h"
#include "backends/image/image_backend.h"
#include "backends/module_backend.h"
#include "backends/onnxruntime/onnxruntime_backend.h"
#include "backends/python/python_backend.h"
#include "common/strings.h"
#include "repository/model_lifecycle.h"
#include "server/server.h"
#include "tools/pack/pack_lib.h"

namespace fs = std::filesystem;
using namespace inferd;

namespace {

// Sends the server's log (fd 2) to a file while it is alive, unless --verbose: the tool's own
// output is the verdict.
class QuietStderr {
 public:
  explicit QuietStderr(bool verbose, const fs::path& log) {
    if (verbose) return;
    saved_ = dup(2);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (saved_ < 0 || fd < 0) return;
    fflush(stderr);
    dup2(fd, 2);
    close(fd);
  }
  ~QuietStderr() {
    if (saved_ < 0) return;
    fflush(stderr);
    dup2(saved_, 2);
    close(saved_);
  }

 private:
  int saved_ = -1;
};

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  for (size_t pos = s->find(from); pos != std::string::npos; pos = s->find(from, pos + to.size())) {
    s->replace(pos, from.size(), to);
  }
}

// The server's message with the scratch repository's paths replaced by the user's, and the
// file it is about in front when the server did not name one (a field error names the model
// and the field, "model 'm': input 'x' ...").
std::string Explain(std::string message, const pack::PackPlan& plan, const fs::path& stage) {
  std::vector<std::string> names{plan.model};
  names.insert(names.end(), plan.parts.begin(), plan.parts.end());
  for (const auto& n : names) {
    ReplaceAll(&message, (stage / n).string(), (fs::path(plan.repository) / n).string());
  }
  if (message.find("config.pbtxt:") != std::string::npos) return message;
  // An ensemble's error wraps its step's: "ensemble 'e' step 1 (model 'm'): <m's error>". The
  // innermost step whose model is being packed is at fault, else the ensemble naming it; a
  // message that then starts with "model 'x':" is about x.
  auto packed = [&names](const std::string& n) {
    return std::find(names.begin(), names.end(), n) != names.end();
  };
  std::string culprit = plan.model;
  static const std::regex kStep(R"(^ensemble '([^']+)' step \d+ \(model '([^']+)'\): )");
  static const std::regex kModel(R"(^model '([^']+)')");
  std::string rest = message;
  std::smatch m;
  while (std::regex_search(rest, m, kStep)) {
    if (packed(m[2].str())) culprit = m[2].str();
    else if (packed(m[1].str())) culprit = m[1].str();
    rest = m.suffix().str();
    if (rest.rfind("the model is not available: ", 0) == 0) rest = rest.substr(28);
  }
  if (std::regex_search(rest, m, kModel) && packed(m[1].str())) culprit = m[1].str();
  const fs::path dir = fs::path(plan.repository) / culprit;
  std::error_code ec;
  const fs::path file = fs::exists(dir / "config.pbtxt", ec) ? dir / "config.pbtxt" : dir;
  return StrCat(file.string(), ": ", message);
}

void RegisterBackends(backends::BackendRegistry* backends, const pack::PackOptions& o) {
  backends->Register(backends::MakeIdentityBackend());
  backends->Register(backends::MakeImageBackend());
  backends->Register(backends::MakeOnnxRuntimeBackend());
  backends->Register(backends::MakePythonBackend());
#ifdef INFERD_WITH_LIBTORCH
  const std::string dir =
      o.backend_directory.empty() ? backends::ExecutableDirectory() : o.backend_directory;
  backends->Register(
      backends::MakeModuleBackend("pytorch", dir + "/libinferd_backend_pytorch.so"));
#endif
}

server::ServerOptions ServerOptionsFor(const pack::PackOptions& o, const fs::path& scratch) {
  server::ServerOptions s;
  s.control_mode = server::ControlMode::kExplicit;
  s.auto_complete = o.auto_complete;
  s.cpu_cores = std::max(1u, std::thread::hardware_concurrency());
  s.exit_on_error = true;
  s.load_threads = 1;
  s.sources.cache_dir = (scratch / "cache").string();
  return s;
}

int Run(const pack::PackOptions& o) {
  auto plan = pack::PlanPack(o.input, o.model);
  if (!plan.ok()) {
    std::cerr << "inferd-pack: " << plan.status().message() << "\n";
    return 1;
  }
  const char* tmpdir = std::getenv("TMPDIR");
  std::string tmpl = StrCat(tmpdir != nullptr && *tmpdir ? tmpdir : "/tmp", "/inferd-pack.XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    std::perror("inferd-pack: mkdtemp");
    return 1;
  }
  const fs::path scratch(tmpl);
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(p, ec);
    }
  } cleanup{scratch};
  const fs::path stage = scratch / "repository";
  const fs::path log = scratch / "server.log";
  fs::create_directories(stage);
  std::vector<std::string> folders{plan->model};
  folders.insert(folders.end(), plan->parts.begin(), plan->parts.end());
  for (const auto& f : folders) {
    std::error_code ec;
    fs::create_directory_symlink(fs::path(plan->repository) / f, stage / f, ec);
    if (ec) {
      std::cerr << "inferd-pack: cannot link " << f << " into " << stage << ": " << ec.message() << "\n";
      return 1;
    }
  }

  backends::BackendRegistry backends;
  RegisterBackends(&backends, o);

  // 1. Load it as `inferd --model-control-mode=explicit --load-model=<model>` would.
  config::ModelConfig served;
  {
    server::ServerOptions so = ServerOptionsFor(o, scratch);
    so.repositories = {stage.string()};
    so.load_models = {plan->model};
    absl::Status st;
    {
      QuietStderr quiet(o.verbose, log);
      server::Server validator(so, &backends);
      st = validator.Start();
      if (st.ok()) {
        auto cfg = validator.GetModelConfig(plan->model, -1);
        if (cfg.ok()) served = *cfg;
        else st = cfg.status();
      }
      validator.Shutdown();
    }
    if (!st.ok()) {
      std::cerr << "inferd-pack: refused: " << Explain(std::string(st.message()), *plan, stage) << "\n";
      return 1;
    }
  }
  std::cerr << "inferd-pack: " << plan->model << " loads"
            << (plan->parts.empty() ? "" : StrCat(" (ensemble of ", StrJoin(plan->parts, ", "), ")"))
            << " (platform " << served.platform() << ", backend "
            << (served.backend().empty() ? "-" : served.backend()) << ")\n";

  // 2. The archives. A renamed copy renames the ensemble's parts too (<name>_<part>), so that
  // copies loaded side by side never share (and never unload) each other's parts.
  std::error_code ec;
  fs::create_directories(o.output_dir, ec);
  if (ec) {
    std::cerr << "inferd-pack: cannot create " << o.output_dir << ": " << ec.message() << "\n";
    return 1;
  }
  struct Written {
    std::string name, path;
  };
  std::vector<Written> written;
  for (const std::string& name : pack::ArchiveModelNames(o, plan->model)) {
    const bool rename = name != plan->model;
    std::map<std::string, std::string> renames;
    if (rename) {
      for (const auto& p : plan->parts) renames[p] = StrCat(name, "_", p);
    }
    std::vector<pack::ArchiveMember> members;
    for (const auto& f : folders) {
      pack::ArchiveMember m;
      m.source_dir = (fs::path(plan->repository) / f).string();
      m.name_in_archive = f == plan->model ? name : (rename ? renames[f] : f);
      if (rename) {
        const fs::path cfg = fs::path(m.source_dir) / "config.pbtxt";
        std::string text;
        if (fs::exists(cfg)) {
          std::ifstream in(cfg);
          text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
        }
        auto edited = pack::RenameModelConfig(text, cfg.string(), m.name_in_archive, renames);
        if (!edited.ok()) {
          std::cerr << "inferd-pack: " << edited.status().message() << "\n";
          return 1;
        }
        m.config_text = *std::move(edited);
      }
      members.push_back(std::move(m));
    }
    // SageMaker's loader must pick this model out of the archive (repository::ChooseModelFolder
    // on the same layout): nested ensembles could make it pick a part.
    const fs::path layout = scratch / "layout" / name;
    fs::create_directories(layout);
    for (const auto& m : members) fs::create_directory_symlink(m.source_dir, layout / m.name_in_archive, ec);
    auto chosen = repository::ChooseModelFolder(layout.string());
    if (!chosen.ok() || fs::path(*chosen).filename() != name) {
      std::cerr << "inferd-pack: refused: an archive of " << StrJoin(folders, ", ")
                << " would serve '"
                << (chosen.ok() ? fs::path(*chosen).filename().string() : std::string(chosen.status().message()))
                << "' instead of '" << name
                << "' (SageMaker loads the only model of an archive, or its ensemble); "
                   "pack the inner ensemble as its own model\n";
      return 1;
    }
    const std::string path = (fs::path(o.output_dir) / StrCat(name, ".tar.gz")).string();
    auto files = pack::WriteModelArchive(members, path);
    if (!files.ok()) {
      std::cerr << "inferd-pack: " << files.status().message() << "\n";
      return 1;
    }
    written.push_back({name, path});
  }

  // 3. Each archive loads as a SageMaker multi-model load (POST /models with its path) would
  // load it: extracted by the server's code, the model chosen by its rules, served as `name`.
  {
    server::ServerOptions so = ServerOptionsFor(o, scratch);
    absl::Status st;
    std::string failed;
    {
      QuietStderr quiet(o.verbose, log);
      server::Server verifier(so, &backends);
      st = verifier.Start();
      for (const auto& w : written) {
        if (!st.ok()) break;
        st = verifier.LoadModelFromUrl(w.name, fs::absolute(w.path).string());
        if (st.ok()) {
          auto cfg = verifier.GetModelConfig(w.name, -1);
          if (!cfg.ok()) {
            st = cfg.status();
          } else if (cfg->input_size() != served.input_size() ||
                     cfg->output_size() != served.output_size() ||
                     cfg->platform() != served.platform()) {
            st = absl::InternalError("the archive serves a different model than the one validated");
          }
          (void)verifier.ForgetModel(w.name);
          fs::remove_all(scratch / "cache", ec);
        }
        if (!st.ok()) failed = w.path;
      }
      verifier.Shutdown();
    }
    if (!st.ok()) {
      std::cerr << "inferd-pack: " << failed << " does not load back: " << st.message() << "\n";
      for (const auto& w : written) fs::remove(w.path, ec);
      return 1;
    }
  }

  for (const auto& w : written) {
    auto sha = pack::FileSha256(w.path);
    std::cout << w.path << "\t" << fs::file_size(w.path, ec) << " bytes\tsha256 "
              << (sha.ok() ? *sha : "?") << "\n";
  }

  // 4. Upload.
  if (!o.upload.empty()) {
    for (const auto& w : written) {
      repository::S3Config s3 = repository::S3ConfigFromEnvironment();
      auto where = pack::UploadLocation(o.upload, fs::path(w.path).filename().string(), &s3);
      if (!where.ok()) {
        std::cerr << "inferd-pack: --upload: " << where.status().message() << "\n";
        return 1;
      }
      auto up = pack::UploadToS3(s3, *where, w.path);
      if (!up.ok()) {
        std::cerr << "inferd-pack: " << up.status().message() << "\n";
        return 1;
      }
      std::cout << "uploaded s3://" << where->bucket << "/" << where->key << "\tetag " << up->etag
                << "\n";
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  auto options = pack::ParsePackArgs(args);
  if (!options.ok()) {
    std::cerr << "inferd-pack: " << options.status().message() << "\n";
    return 2;
  }
  if (options->help) {
    std::cout << pack::PackUsage();
    return 0;
  }
  try {
    return Run(*options);
  } catch (const std::exception& e) {
    std::cerr << "inferd-pack: " << e.what() << "\n";
    return 1;
  }
}
