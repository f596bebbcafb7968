#include "storage/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string_view>

#include "common/strings.h"

namespace inferd::storage {
namespace fs = std::filesystem;
namespace {

// A relative path that stays inside its root: no empty path, no absolute path, no ".."
// component. "./a/b" and "a//b" are fine.
bool StaysInside(std::string_view path) {
  if (path.empty() || path.front() == '/') return false;
  size_t pos = 0;
  while (pos <= path.size()) {
    size_t slash = path.find('/', pos);
    if (slash == std::string_view::npos) slash = path.size();
    if (path.substr(pos, slash - pos) == "..") return false;
    pos = slash + 1;
  }
  return true;
}

absl::Status Corrupt(const std::string& archive, struct archive* a) {
  const char* why = archive_error_string(a);
  return absl::InvalidArgumentError(
      StrCat("cannot read archive '", fs::path(archive).filename().string(), "': ",
             why ? why : "unknown error"));
}

}  // namespace

absl::Status ExtractArchive(const std::string& archive_path, const std::string& dest_dir,
                            const ExtractLimits& limits) {
  std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_read_new(),
                                                             archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_all(a.get());
  if (archive_read_open_filename(a.get(), archive_path.c_str(), 1 << 16) != ARCHIVE_OK) {
    return Corrupt(archive_path, a.get());
  }
  std::error_code ec;
  fs::create_directories(dest_dir, ec);
  if (ec) {
    return absl::InternalError(StrCat("cannot create '", dest_dir, "': ", ec.message()));
  }
  const fs::path root = fs::canonical(dest_dir);
  uint64_t total = 0;
  uint64_t entries = 0;
  archive_entry* entry = nullptr;
  for (;;) {
    int r = archive_read_next_header(a.get(), &entry);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return Corrupt(archive_path, a.get());
    if (++entries > limits.max_entries) {
      return absl::InvalidArgumentError(StrCat("archive has more than ", limits.max_entries,
                                               " entries"));
    }
    const char* raw_name = archive_entry_pathname(entry);
    const std::string name = raw_name ? raw_name : "";
    if (!StaysInside(name)) {
      return absl::InvalidArgumentError(
          StrCat("archive entry '", name, "' would be written outside the model folder"));
    }
    const fs::path target = root / name;
    const mode_t type = archive_entry_filetype(entry);
    if (type == AE_IFDIR) {
      fs::create_directories(target, ec);
      if (ec) return absl::InternalError(StrCat("cannot create '", target.string(), "': ", ec.message()));
      continue;
    }
    if (const char* hard = archive_entry_hardlink(entry)) {
      return absl::InvalidArgumentError(
          StrCat("archive entry '", name, "' is a hard link (to '", hard, "'); not accepted"));
    }
    if (type == AE_IFLNK) {
      const char* link = archive_entry_symlink(entry);
      const std::string dest = link ? link : "";
      // The link must resolve inside the root from the folder it sits in.
      const fs::path parent = fs::path(name).parent_path();
      const std::string resolved = (parent / dest).lexically_normal().string();
      if (dest.empty() || dest.front() == '/' || !StaysInside(resolved) ||
          resolved.rfind("..", 0) == 0) {
        return absl::InvalidArgumentError(
            StrCat("archive entry '", name, "' links to '", dest, "', outside the model folder"));
      }
      fs::create_directories(target.parent_path(), ec);
      fs::create_symlink(dest, target, ec);
      if (ec) return absl::InternalError(StrCat("cannot create link '", target.string(), "': ", ec.message()));
      continue;
    }
    if (type != AE_IFREG) {
      return absl::InvalidArgumentError(
          StrCat("archive entry '", name, "' is a device, FIFO or socket; not accepted"));
    }
    fs::create_directories(target.parent_path(), ec);
    if (ec) return absl::InternalError(StrCat("cannot create '", target.parent_path().string(), "': ", ec.message()));
    // A link extracted earlier must not redirect this file outside the root.
    const fs::path real_parent = fs::weakly_canonical(target.parent_path(), ec);
    const std::string rp = real_parent.string();
    if (ec || rp.compare(0, root.string().size(), root.string()) != 0) {
      return absl::InvalidArgumentError(
          StrCat("archive entry '", name, "' would be written through a link outside the model folder"));
    }
    int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::InvalidArgumentError(
          StrCat("cannot write archive entry '", name, "' (duplicate or unwritable)"));
    }
    const void* buf = nullptr;
    size_t size = 0;
    la_int64_t offset = 0;
    absl::Status status;
    for (;;) {
      r = archive_read_data_block(a.get(), &buf, &size, &offset);
      if (r == ARCHIVE_EOF) break;
      if (r != ARCHIVE_OK && r != ARCHIVE_WARN) {
        status = Corrupt(archive_path, a.get());
        break;
      }
      total += size;
      if (total > limits.max_total_bytes) {
        status = absl::InvalidArgumentError(StrCat(
            "archive expands to more than ", limits.max_total_bytes, " bytes"));
        break;
      }
      if (::pwrite(fd, buf, size, offset) != static_cast<ssize_t>(size)) {
        status = absl::InternalError(StrCat("cannot write '", target.string(), "'"));
        break;
      }
    }
    ::close(fd);
    if (!status.ok()) return status;
  }
  return absl::OkStatus();
}

}  // namespace inferd::storage
