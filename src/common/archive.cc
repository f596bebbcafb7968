#include "common/archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <deque>
#include <exception>
#include <filesystem>
#include <memory>
#include <string_view>
#include <system_error>
#include <thread>

#include "common/mutex.h"
#include "common/rooted_dir.h"
#include "common/strings.h"

namespace inferd {
namespace fs = std::filesystem;
namespace {

using ArchivePtr = std::unique_ptr<struct archive, int (*)(struct archive*)>;

ArchivePtr NewReader() {
  ArchivePtr a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_all(a.get());
  return a;
}

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

// One extraction: where it writes, what it reads, and what it has written so far.
struct Extraction {
  struct archive* a = nullptr;
  std::string_view what;         // names the archive in messages
  RootedDir* root = nullptr;     // the destination; every entry is created beneath it
  ExtractLimits limits;
  // Set when the bytes stopped arriving (a failed download): libarchive then reports a
  // truncated archive, but the reader's own error is the one to return.
  const absl::Status* source_status = nullptr;
  uint64_t total = 0;
  uint64_t entries = 0;
};

absl::Status ReadError(const Extraction& x) {
  if (x.source_status != nullptr && !x.source_status->ok()) return *x.source_status;
  const char* why = archive_error_string(x.a);
  return absl::InvalidArgumentError(
      StrCat("cannot read archive '", x.what, "': ", why ? why : "unknown error"));
}

// An entry RootedDir refused: INVALID_ARGUMENT names the entry (the archive's fault); a
// failure of the disk stays INTERNAL.
absl::Status EntryError(const std::string& name, const absl::Status& st) {
  if (absl::IsInvalidArgument(st)) {
    return absl::InvalidArgumentError(StrCat(
        "archive entry '", name, "' would be written outside the model folder (", st.message(), ")"));
  }
  if (absl::IsAlreadyExists(st)) {
    return absl::InvalidArgumentError(
        StrCat("cannot write archive entry '", name, "' (duplicate or unwritable)"));
  }
  return st;
}

// A symbolic link is kept only when it resolves inside the root from the (real) folder it sits
// in (RootedDir::CreateSymlink), whatever links came before it.
absl::Status ExtractSymlink(Extraction& x, archive_entry* entry, const std::string& name) {
  const char* link = archive_entry_symlink(entry);
  const std::string dest = link ? link : "";
  if (x.limits.keep_links_out && !dest.empty()) {
    // Nothing is resolved through it while extracting (RESOLVE_BENEATH refuses it).
    absl::StatusOr<UniqueFd> parent = x.root->MakeDirs(fs::path(name).parent_path().string());
    if (!parent.ok()) return EntryError(name, parent.status());
    const std::string base = fs::path(name).filename().string();
    if (base.empty() || ::symlinkat(dest.c_str(), parent->get(), base.c_str()) != 0) {
      return absl::InvalidArgumentError(
          StrCat("cannot create link '", name, "': ", base.empty() ? "no name" : strerror(errno)));
    }
    return absl::OkStatus();
  }
  absl::Status st = x.root->CreateSymlink(name, dest);
  if (absl::IsInvalidArgument(st)) {
    return absl::InvalidArgumentError(StrCat("archive entry '", name, "' links to '", dest,
                                             "', outside the model folder (", st.message(), ")"));
  }
  return EntryError(name, st);
}

// Copies the entry's data blocks into `fd` (sparse files keep their holes), counting the
// bytes against the size cap.
absl::Status WriteEntryData(Extraction& x, int fd, const std::string& name) {
  const void* buf = nullptr;
  size_t size = 0;
  la_int64_t offset = 0;
  for (;;) {
    const int r = archive_read_data_block(x.a, &buf, &size, &offset);
    if (r == ARCHIVE_EOF) return absl::OkStatus();
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ReadError(x);
    x.total += size;
    if (x.total > x.limits.max_total_bytes) {
      return absl::InvalidArgumentError(
          StrCat("archive expands to more than ", x.limits.max_total_bytes, " bytes"));
    }
    if (::pwrite(fd, buf, size, offset) != static_cast<ssize_t>(size)) {
      return absl::InternalError(
          StrCat("cannot write '", x.root->path(), "/", name, "': ", strerror(errno)));
    }
  }
}

absl::Status ExtractRegularFile(Extraction& x, const std::string& name) {
  // Created beneath the root: a link extracted earlier cannot redirect it outside.
  absl::StatusOr<UniqueFd> fd = x.root->CreateFile(name, 0644);
  if (!fd.ok()) return EntryError(name, fd.status());
  return WriteEntryData(x, fd->get(), name);
}

absl::Status ExtractEntry(Extraction& x, archive_entry* entry) {
  const char* raw_name = archive_entry_pathname(entry);
  const std::string name = raw_name ? raw_name : "";
  if (!StaysInside(name)) {
    return absl::InvalidArgumentError(
        StrCat("archive entry '", name, "' would be written outside the model folder"));
  }
  const mode_t type = archive_entry_filetype(entry);
  if (type == AE_IFDIR) {
    absl::StatusOr<UniqueFd> dir = x.root->MakeDirs(name);
    return dir.ok() ? absl::OkStatus() : EntryError(name, dir.status());
  }
  if (const char* hard = archive_entry_hardlink(entry)) {
    return absl::InvalidArgumentError(
        StrCat("archive entry '", name, "' is a hard link (to '", hard, "'); not accepted"));
  }
  if (type == AE_IFLNK) return ExtractSymlink(x, entry, name);
  if (type != AE_IFREG) {
    return absl::InvalidArgumentError(
        StrCat("archive entry '", name, "' is a device, FIFO or socket; not accepted"));
  }
  return ExtractRegularFile(x, name);
}

// The loop both entry points share, once the archive is open.
absl::Status ExtractEntries(Extraction& x) {
  archive_entry* entry = nullptr;
  for (;;) {
    const int r = archive_read_next_header(x.a, &entry);
    if (r == ARCHIVE_EOF) return absl::OkStatus();
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ReadError(x);
    if (++x.entries > x.limits.max_entries) {
      return absl::InvalidArgumentError(
          StrCat("archive has more than ", x.limits.max_entries, " entries"));
    }
    if (absl::Status st = ExtractEntry(x, entry); !st.ok()) return st;
  }
}

// Creates `dest_dir` (and its parents) and opens it as the root every entry is created beneath.
absl::StatusOr<RootedDir> CreateRoot(const std::string& dest_dir) {
  std::error_code ec;
  fs::create_directories(dest_dir, ec);
  if (ec) {
    return absl::InternalError(StrCat("cannot create '", dest_dir, "': ", ec.message()));
  }
  return RootedDir::Open(dest_dir);
}

// libarchive's read callback over an ArchiveChunkReader. The reader's error is kept so the
// extraction can return it instead of "truncated archive".
struct StreamContext {
  const ArchiveChunkReader* read = nullptr;
  absl::Status status;
  bool at_end = false;
};

la_ssize_t ReadChunk(struct archive* a, void* user, const void** buffer) {
  auto* ctx = static_cast<StreamContext*>(user);
  absl::StatusOr<std::string_view> chunk;
  // No exception may unwind through libarchive's C frames.
  try {
    chunk = (*ctx->read)();
  } catch (const std::exception& e) {
    chunk = absl::InternalError(StrCat("reading the archive stream: ", e.what()));
  }
  if (!chunk.ok()) {
    ctx->status = chunk.status();
    archive_set_error(a, EIO, "%s", std::string(ctx->status.message()).c_str());
    return ARCHIVE_FATAL;
  }
  if (chunk->empty()) ctx->at_end = true;
  *buffer = chunk->data();
  return static_cast<la_ssize_t>(chunk->size());
}

// Reads what libarchive left unread (after the end-of-archive marker, or once the untar stage
// stopped), so every error and length check of the stream runs.
absl::Status DrainStream(StreamContext& ctx) {
  while (ctx.status.ok() && !ctx.at_end) {
    absl::StatusOr<std::string_view> chunk = (*ctx.read)();
    if (!chunk.ok()) return chunk.status();
    ctx.at_end = chunk->empty();
  }
  return ctx.status;
}

// Decompressed bytes on their way from the gunzip thread to the untar thread: a queue of
// chunks bounded in bytes. One producer, one consumer.
class ChunkPipe {
 public:
  explicit ChunkPipe(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Producer: false once the consumer wants no more.
  bool Push(std::string chunk) {
    inferd::MutexLock lock(&mu_);
    auto has_room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return stopped_ || queued_bytes_ < max_bytes_;
    };
    mu_.Await(absl::Condition(&has_room));
    if (stopped_) return false;
    queued_bytes_ += chunk.size();
    chunks_.push_back(std::move(chunk));
    return true;
  }
  // Producer: no more bytes; OK at the end of the data, else the producer's error.
  void Close(const absl::Status& status) {
    inferd::MutexLock lock(&mu_);
    closed_ = true;
    status_ = status;
  }
  // Consumer: the next chunk (valid until the next call), empty at the end, or the producer's
  // error.
  absl::StatusOr<std::string_view> Next() {
    current_.clear();
    inferd::MutexLock lock(&mu_);
    auto readable = [&]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !chunks_.empty() || closed_; };
    mu_.Await(absl::Condition(&readable));
    if (chunks_.empty()) {
      if (!status_.ok()) return status_;
      return std::string_view();
    }
    current_ = std::move(chunks_.front());
    chunks_.pop_front();
    queued_bytes_ -= current_.size();
    return std::string_view(current_);
  }
  // Consumer: wants no more (done or failed); a waiting or later Push returns false.
  void Stop() {
    inferd::MutexLock lock(&mu_);
    stopped_ = true;
  }

 private:
  const size_t max_bytes_;
  inferd::Mutex mu_;
  std::deque<std::string> chunks_ ABSL_GUARDED_BY(mu_);
  size_t queued_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::string current_;  // the consumer's chunk, which libarchive reads in place
};

// Enough decompressed bytes queued that neither stage waits on the other's hiccups.
constexpr size_t kPipeBytes = size_t{4} << 20;

// Stage one, on its own thread: `read`'s bytes through libarchive's decompression filters
// (the raw format: no archive format, any compression or none) into `pipe`. Once the untar
// stage wants no more (it reached the end of the archive, or failed) the rest of the
// compressed stream is still read, undecompressed, so every error of the source surfaces.
absl::Status Decompress(const ArchiveChunkReader& read, std::string_view what, ChunkPipe& pipe) {
  ArchivePtr a(archive_read_new(), archive_read_free);
  archive_read_support_filter_all(a.get());
  archive_read_support_format_raw(a.get());
  StreamContext ctx;
  ctx.read = &read;
  Extraction x;
  x.a = a.get();
  x.what = what;
  x.source_status = &ctx.status;
  archive_entry* entry = nullptr;
  if (archive_read_open(a.get(), &ctx, nullptr, ReadChunk, nullptr) != ARCHIVE_OK) {
    return ReadError(x);
  }
  int r = archive_read_next_header(a.get(), &entry);
  if (r == ARCHIVE_EOF) return DrainStream(ctx);  // no bytes at all
  if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ReadError(x);
  for (;;) {
    const void* buf = nullptr;
    size_t size = 0;
    la_int64_t offset = 0;
    r = archive_read_data_block(a.get(), &buf, &size, &offset);
    if (r == ARCHIVE_EOF) break;
    if (r != ARCHIVE_OK && r != ARCHIVE_WARN) return ReadError(x);
    if (!pipe.Push(std::string(static_cast<const char*>(buf), size))) break;
  }
  return DrainStream(ctx);
}

// Stage two, on the calling thread: the decompressed bytes as an archive, into `root`.
absl::Status Untar(ChunkPipe& pipe, std::string_view what, RootedDir& root,
                   const ExtractLimits& limits) {
  ArchivePtr a = NewReader();
  const ArchiveChunkReader next = [&pipe] { return pipe.Next(); };
  StreamContext ctx;
  ctx.read = &next;
  Extraction x;
  x.a = a.get();
  x.what = what;
  x.root = &root;
  x.limits = limits;
  x.source_status = &ctx.status;
  if (archive_read_open(a.get(), &ctx, nullptr, ReadChunk, nullptr) != ARCHIVE_OK) {
    return ReadError(x);
  }
  return ExtractEntries(x);
}

}  // namespace

absl::Status ExtractArchive(const std::string& archive_path, const std::string& dest_dir,
                            const ExtractLimits& limits) {
  ArchivePtr a = NewReader();
  const std::string name = fs::path(archive_path).filename().string();
  Extraction x;
  x.a = a.get();
  x.what = name;
  x.limits = limits;
  if (archive_read_open_filename(a.get(), archive_path.c_str(), 1 << 16) != ARCHIVE_OK) {
    return ReadError(x);
  }
  absl::StatusOr<RootedDir> root = CreateRoot(dest_dir);
  if (!root.ok()) return root.status();
  x.root = &*root;
  return ExtractEntries(x);
}

absl::Status ExtractArchiveStream(const ArchiveChunkReader& read, std::string_view what,
                                  const std::string& dest_dir, const ExtractLimits& limits,
                                  const std::function<void()>& cancel) {
  absl::StatusOr<RootedDir> root = CreateRoot(dest_dir);
  if (!root.ok()) return root.status();
  ChunkPipe pipe(kPipeBytes);
  absl::Status decompressed;
  std::thread gunzip;
  try {
    gunzip = std::thread([&] {
      decompressed = Decompress(read, what, pipe);
      pipe.Close(decompressed);
    });
  } catch (const std::system_error& e) {
    return absl::ResourceExhaustedError(
        StrCat("cannot start a thread to extract '", what, "': ", e.what()));
  }
  absl::Status untarred = Untar(pipe, what, *root, limits);
  pipe.Stop();
  if (!untarred.ok() && cancel) cancel();  // a read waiting for bytes returns now
  gunzip.join();
  // An error the gunzip stage met reaches the untar stage through the pipe, as it was.
  if (!untarred.ok()) return untarred;
  return decompressed;
}

}  // namespace inferd
