#include "common/rooted_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "common/strings.h"

namespace inferd {
namespace {

std::atomic<bool> force_no_openat2{false};
std::atomic<bool> openat2_missing{false};

// The components of a relative path, without empty and "." ones.
std::vector<std::string_view> Components(std::string_view rel) {
  std::vector<std::string_view> out;
  size_t pos = 0;
  while (pos <= rel.size()) {
    size_t slash = rel.find('/', pos);
    if (slash == std::string_view::npos) slash = rel.size();
    const std::string_view c = rel.substr(pos, slash - pos);
    if (!c.empty() && c != ".") out.push_back(c);
    pos = slash + 1;
  }
  return out;
}

bool HasDotDot(const std::vector<std::string_view>& parts) {
  for (std::string_view c : parts) {
    if (c == "..") return true;
  }
  return false;
}

absl::Status Outside(const std::string& root, std::string_view rel, std::string_view why) {
  return absl::InvalidArgumentError(
      StrCat("'", rel, "' would reach outside '", root, "'", why.empty() ? "" : ": ", why));
}

absl::Status Failed(const std::string& root, std::string_view rel, std::string_view op, int err) {
  return absl::InternalError(StrCat("cannot ", op, " '", root, "/", rel, "': ", strerror(err)));
}

// openat2(dirfd, path, flags, resolve); -1 with errno set on failure (ENOSYS: no openat2).
int Openat2(int dirfd, const std::string& path, int flags, mode_t mode, uint64_t resolve) {
  if (force_no_openat2.load(std::memory_order_relaxed) ||
      openat2_missing.load(std::memory_order_relaxed)) {
    errno = ENOSYS;
    return -1;
  }
  struct open_how how;
  memset(&how, 0, sizeof(how));
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.mode = (flags & O_CREAT) ? mode : 0;
  how.resolve = resolve;
  for (int attempt = 0;; ++attempt) {
    const long r = ::syscall(SYS_openat2, dirfd, path.c_str(), &how, sizeof(how));
    if (r >= 0) return static_cast<int>(r);
    // EAGAIN: a rename elsewhere raced a ".." lookup; the kernel asks to retry.
    if (errno == EAGAIN && attempt < 16) continue;
    // ENOSYS: a kernel before 5.6. EPERM: a seccomp filter that predates openat2 (older
    // container runtimes' default profiles) refuses it; open(2) itself never says EPERM here.
    if (errno == ENOSYS || errno == EPERM) {
      openat2_missing.store(true, std::memory_order_relaxed);
      errno = ENOSYS;
    }
    return -1;
  }
}

constexpr uint64_t kBeneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;

// One step down from `cur` (already beneath the root) into the directory `name`, following a
// link only while it stays beneath the root (resolved again from the root as `prefix`).
// -1 with errno on failure; EXDEV when it would leave the root.
int StepInto(int root, int cur, std::string_view name, const std::string& prefix,
             bool follow_links) {
  const std::string n(name);
  int fd = Openat2(cur, n, O_RDONLY | O_DIRECTORY, 0, kBeneath | RESOLVE_NO_SYMLINKS);
  if (fd >= 0 || errno != ELOOP || !follow_links) {
    if (fd < 0 && errno == ENOSYS) {
      // No openat2: never follow a link (ELOOP or ENOTDIR on one).
      fd = ::openat(cur, n.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    return fd;
  }
  // A link: where it leads, judged by the kernel from the root.
  return Openat2(root, prefix, O_RDONLY | O_DIRECTORY, 0, kBeneath);
}

bool IsLinkRefusal(int err) { return err == ELOOP || err == EXDEV || err == ENOTDIR; }

}  // namespace

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = other.release();
  }
  return *this;
}

UniqueFd::~UniqueFd() {
  if (fd_ >= 0) ::close(fd_);
}

bool LexicallyInside(std::string_view rel) {
  if (rel.empty() || rel.front() == '/') return false;
  int depth = 0;
  for (std::string_view c : Components(rel)) {
    depth += c == ".." ? -1 : 1;
    if (depth < 0) return false;
  }
  return true;
}

absl::Status EnsurePrivateDir(const std::string& path, std::string_view what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p = fs::absolute(fs::path(path), ec).lexically_normal();
  // Missing folders are created 0700, from the top down.
  std::vector<fs::path> missing;
  for (fs::path q = p; !q.empty() && q != q.root_path(); q = q.parent_path()) {
    if (fs::exists(fs::symlink_status(q, ec))) break;
    missing.push_back(q);
  }
  for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
    if (::mkdir(it->c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InternalError(
          StrCat(what, ": cannot create the folder '", it->string(), "': ", strerror(errno)));
    }
  }
  // Checked after creating too: a folder someone else made first under that name is refused.
  struct stat st;
  if (::lstat(p.c_str(), &st) != 0) {
    return absl::InternalError(StrCat(what, ": cannot read '", path, "': ", strerror(errno)));
  }
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(StrCat(
        what, ": '", path, "' is ", S_ISLNK(st.st_mode) ? "a link" : "not a folder",
        "; give a folder of your own (remove it, or name another one)"));
  }
  if (st.st_uid != ::geteuid()) {
    return absl::FailedPreconditionError(StrCat(
        what, ": '", path, "' is owned by uid ", st.st_uid, ", not by this server's user (uid ",
        ::geteuid(), "); another user could plant models in it. Fix: chown ", ::geteuid(), " '",
        path, "' (and chmod 700), or name a folder of your own"));
  }
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    return absl::FailedPreconditionError(StrCat(
        what, ": '", path, "' is writable by its group or by others, who could plant models in it. "
        "Fix: chmod go-w '", path, "'"));
  }
  // Each folder above must be ours or root's, and writable by others only with the sticky bit
  // (like /tmp): else its owner could swap this folder for another after the check.
  for (fs::path q = p.parent_path(); !q.empty(); q = q.parent_path()) {
    if (::stat(q.c_str(), &st) != 0) break;
    if ((st.st_uid != 0 && st.st_uid != ::geteuid()) ||
        ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))) {
      return absl::FailedPreconditionError(StrCat(
          what, ": the folder '", q.string(), "' above '", path,
          "' is owned or writable by another user, who could replace it. Fix: name a folder "
          "whose parents only you or root can write"));
    }
    if (q == q.root_path()) break;
  }
  return absl::OkStatus();
}

std::string DefaultPrivateCacheDir() {
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && xdg[0] == '/') {
    return StrCat(xdg, "/inferd");
  }
  return StrCat("/tmp/inferd-", ::geteuid());
}

void RootedDir::ForceNoOpenat2ForTesting(bool force) { force_no_openat2.store(force); }

absl::StatusOr<RootedDir> RootedDir::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Failed(path, "", "open the folder", errno);
  return RootedDir(UniqueFd(fd), path);
}

absl::StatusOr<UniqueFd> RootedDir::Dirs(std::string_view rel, bool create, bool follow_links) {
  if (!rel.empty() && rel.front() == '/') return Outside(path_, rel, "it is absolute");
  const std::vector<std::string_view> parts = Components(rel);
  if (HasDotDot(parts)) return Outside(path_, rel, "it has a '..' component");
  UniqueFd cur(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (cur.get() < 0) return Failed(path_, rel, "open", errno);
  std::string prefix;
  for (std::string_view name : parts) {
    if (!prefix.empty()) prefix += '/';
    prefix += name;
    int fd = StepInto(fd_.get(), cur.get(), name, prefix, follow_links);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(cur.get(), std::string(name).c_str(), 0755) != 0 && errno != EEXIST) {
        return Failed(path_, prefix, "create the folder", errno);
      }
      fd = StepInto(fd_.get(), cur.get(), name, prefix, follow_links);
    }
    if (fd < 0) {
      const int err = errno;
      if (IsLinkRefusal(err)) {
        return Outside(path_, rel,
                       StrCat("'", prefix, "' is ",
                              follow_links ? "a link that leaves the folder, or not a folder"
                                           : "a link or not a folder"));
      }
      return Failed(path_, prefix, create ? "create the folder" : "open", err);
    }
    cur = UniqueFd(fd);
  }
  return cur;
}

absl::StatusOr<UniqueFd> RootedDir::MakeDirs(std::string_view rel) {
  return Dirs(rel, /*create=*/true, /*follow_links=*/true);
}

namespace {
// Splits "a/b/c" into ("a/b", "c"), ignoring trailing slashes.
std::pair<std::string_view, std::string_view> SplitLast(std::string_view rel) {
  while (rel.size() > 1 && rel.back() == '/') rel.remove_suffix(1);
  const size_t slash = rel.rfind('/');
  if (slash == std::string_view::npos) return {std::string_view(), rel};
  return {rel.substr(0, slash), rel.substr(slash + 1)};
}
}  // namespace

absl::StatusOr<UniqueFd> RootedDir::CreateFile(std::string_view rel, mode_t mode) {
  const auto [dir, base] = SplitLast(rel);
  if (base.empty() || base == "." || base == "..") {
    return absl::InvalidArgumentError(StrCat("'", rel, "' does not name a file"));
  }
  absl::StatusOr<UniqueFd> parent = Dirs(dir, /*create=*/true, /*follow_links=*/true);
  if (!parent.ok()) return parent.status();
  // O_EXCL never follows a link in the last component: an existing name of any kind fails.
  const int fd = ::openat(parent->get(), std::string(base).c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) {
    const int err = errno;
    if (err == EEXIST) return absl::AlreadyExistsError(StrCat("'", rel, "' exists already"));
    return Failed(path_, rel, "create", err);
  }
  return UniqueFd(fd);
}

absl::Status RootedDir::CreateSymlink(std::string_view rel, std::string_view target) {
  const auto [dir, base] = SplitLast(rel);
  if (base.empty() || base == "." || base == "..") {
    return absl::InvalidArgumentError(StrCat("'", rel, "' does not name a link"));
  }
  const std::vector<std::string_view> dir_parts = Components(dir);
  if (target.empty() || target.front() == '/') {
    return Outside(path_, rel, StrCat("it links to '", target, "'"));
  }
  // Leading ".." only, no more than the link's folder is deep.
  size_t up = 0;
  bool descending = false;
  for (std::string_view c : Components(target)) {
    if (c == "..") {
      if (descending) {
        return Outside(path_, rel,
                       StrCat("it links to '", target, "' (a '..' after a name may climb out of a link)"));
      }
      ++up;
    } else {
      descending = true;
    }
  }
  if (up > dir_parts.size()) return Outside(path_, rel, StrCat("it links to '", target, "'"));
  // The link's folder, reached through real folders only, so its depth is its depth.
  absl::StatusOr<UniqueFd> parent = Dirs(dir, /*create=*/true, /*follow_links=*/false);
  if (!parent.ok()) return parent.status();
  if (::symlinkat(std::string(target).c_str(), parent->get(), std::string(base).c_str()) != 0) {
    const int err = errno;
    if (err == EEXIST) return absl::AlreadyExistsError(StrCat("'", rel, "' exists already"));
    return Failed(path_, rel, "create the link", err);
  }
  return absl::OkStatus();
}

absl::StatusOr<UniqueFd> RootedDir::OpenBeneath(std::string_view rel, int flags) const {
  if (rel.empty() || rel.front() == '/' || !LexicallyInside(rel)) {
    return Outside(path_, rel, "");
  }
  int fd = Openat2(fd_.get(), std::string(rel), flags, 0, kBeneath);
  if (fd < 0 && errno == ENOSYS) {
    // Component by component, following no link; ".." is lexical (no link was followed).
    std::vector<std::string_view> parts;
    for (std::string_view c : Components(rel)) {
      if (c == "..") {
        parts.pop_back();  // LexicallyInside: never empty here
      } else {
        parts.push_back(c);
      }
    }
    UniqueFd cur(::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
    for (size_t i = 0; cur.get() >= 0 && i + 1 < parts.size(); ++i) {
      cur = UniqueFd(::openat(cur.get(), std::string(parts[i]).c_str(),
                              O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    }
    if (cur.get() < 0) {
      fd = -1;
    } else if (parts.empty()) {
      fd = ::fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0);
    } else {
      fd = ::openat(cur.get(), std::string(parts.back()).c_str(), flags | O_NOFOLLOW | O_CLOEXEC);
    }
  }
  if (fd < 0) {
    const int err = errno;
    if (err == EXDEV || err == ELOOP) return Outside(path_, rel, "through a link");
    if (err == ENOENT) return absl::NotFoundError(StrCat("'", rel, "' does not exist in '", path_, "'"));
    return Failed(path_, rel, "open", err);
  }
  return UniqueFd(fd);
}

}  // namespace inferd
