// Creating and opening files strictly beneath one directory, whatever links already sit in it.
//
// Archive extraction, S3 folder downloads and config fields that name files all take a path
// from someone else and must not reach outside a model's folder. Checking the path's text is
// not enough: a link extracted earlier (`a/l1 -> ..`) changes where a later, innocent-looking
// path (`a/l1/l2/x`) lands. So every directory, file and link is created relative to a
// descriptor of the root, with the kernel resolving each path beneath it: `openat2` with
// RESOLVE_BENEATH (Linux 5.6+), which follows a link only while it stays beneath the root and
// fails with EXDEV otherwise, at the moment of the call. Where `openat2` is missing (ENOSYS),
// the path is walked one component at a time with O_NOFOLLOW: stricter (no link is followed
// at all) and just as safe.
//
// A link itself is created only where its target resolves beneath the root from the folder it
// sits in (see CreateSymlink), so the finished tree holds no way out either, for the readers
// that come after the extraction.
#pragma once

#include <sys/types.h>

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace inferd {

// An owned file descriptor (closed on destruction); -1 when empty.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd();

  int get() const { return fd_; }
  int release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_ = -1;
};

// One directory that paths are resolved beneath. Paths given to its methods are relative
// ("a/b", "./a//b"); an absolute path or a ".." component is refused up front. Errors: a path
// that would leave the root (through a ".." or a link) is INVALID_ARGUMENT naming the path; a
// failure of the file system (no space, no permission) is INTERNAL.
//
// Thread safety: the methods may be called from several threads (each call is its own
// resolution); the object must outlive them. Movable, not copyable.
class RootedDir {
 public:
  // Opens the existing directory `path` as the root.
  static absl::StatusOr<RootedDir> Open(const std::string& path);

  RootedDir(RootedDir&&) = default;
  RootedDir& operator=(RootedDir&&) = default;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }

  // Opens the directory `rel` beneath the root, creating missing components (mode 0755).
  // Links on the way are followed only while they stay beneath the root. "" is the root.
  absl::StatusOr<UniqueFd> MakeDirs(std::string_view rel);

  // Creates the regular file `rel` (which must not exist yet) for writing, its folder as by
  // MakeDirs. An existing entry of that name (file, link, anything) is ALREADY_EXISTS.
  absl::StatusOr<UniqueFd> CreateFile(std::string_view rel, mode_t mode = 0644);

  // Creates the symbolic link `rel` -> `target`. The link's folder must be reached without
  // following links, and `target` must be relative, with its ".." components only at its
  // start and no more of them than the folder is deep. Then the link resolves beneath the
  // root from where it sits, and by induction so does every path through links created so:
  // the ".." part climbs real directories inside the root, the rest descends (into real
  // directories, or into links that obey the same rule).
  absl::Status CreateSymlink(std::string_view rel, std::string_view target);

  // Opens the existing entry `rel` beneath the root with `flags` (O_RDONLY, O_DIRECTORY, ...).
  absl::StatusOr<UniqueFd> OpenBeneath(std::string_view rel, int flags) const;

  // Tests: walk component by component with O_NOFOLLOW, as on a kernel without openat2.
  static void ForceNoOpenat2ForTesting(bool force);

 private:
  RootedDir(UniqueFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

  absl::StatusOr<UniqueFd> Dirs(std::string_view rel, bool create, bool follow_links);

  UniqueFd fd_;
  std::string path_;  // for messages
};

// Makes `path` (and missing parents, 0700) a folder only this process's user can use, or
// checks the one that is there, as ssh's StrictModes checks a key file: it must be a real
// folder (not a link), owned by the effective user, and not writable by group or others.
// A folder that fails is FAILED_PRECONDITION with the command that fixes it; one that cannot
// be created is INTERNAL. `what` names the setting in messages ("--model-cache-dir").
absl::Status EnsurePrivateDir(const std::string& path, std::string_view what);

// The per-user folder for files inferd keeps between runs, when no flag names one:
// $XDG_CACHE_HOME/inferd, else /tmp/inferd-<uid> (created 0700 by EnsurePrivateDir, which
// refuses one another user planted in advance). Not ~/.cache: a container's root file system
// is often read-only, and /tmp is where its writable mount goes.
std::string DefaultPrivateCacheDir();

// True when the relative path `rel`, taken lexically, stays inside its folder: not absolute,
// and no ".." climbs above the start ("a/../b" is fine, "a/../../b" is not). Triton's
// IsChildPathEscapingParentPath, on text.
bool LexicallyInside(std::string_view rel);

}  // namespace inferd
