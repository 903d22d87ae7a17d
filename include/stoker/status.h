#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <utility>

namespace stoker {

/// What kind of failure a Status carries. Callers branch on the code; the
/// message is for people and names the file, sample or option involved.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // an option or argument is out of range or malformed
  kNotFound,            // a file, class folder or member is missing
  kIoError,             // the OS refused a read, open or stat
  kDataError,           // the bytes are not what they claim (corrupt, truncated)
  kUnsupported,         // valid input this build cannot handle
  kResourceExhausted,   // a sample exceeds a budget or cap (pixels, bytes)
  kUnavailable,         // the machine refused a resource (memory, file descriptors, threads)
  kCancelled,           // the loader was stopped
  kFailedPrecondition,  // the object cannot serve this call here (a loader in a forked child)
  kOutOfRange,          // a sampler's index past the data set's end (Python's IndexError)
  kInternal,            // a bug
};

/// Returns a short stable name for `code`, e.g. "data error".
const char* StatusCodeName(StatusCode code);

/// What the maker of an error knows beyond its code and message, for its own
/// reader (a Python dataset's exception, which the bindings raise as its
/// type): opaque to the engine, which keeps it through copies, context and
/// its batch reports. Subclassed by the maker; immutable once attached.
class StatusDetail {
 public:
  virtual ~StatusDetail() = default;
};

/// The outcome of an operation: ok, or a code and a message, and an
/// optional detail. A value type; safe to copy and to move across threads.
/// An ok Status is its code and a null pointer: making, moving and dropping
/// one (on every sample's path) costs next to nothing; an error's message
/// and detail live on the heap, as leveldb's Status keeps its state.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code),
        rep_(code != StatusCode::kOk || !message.empty() ? Make(std::move(message)) : nullptr) {}
  Status(const Status& other)
      : code_(other.code_), rep_(other.rep_ != nullptr ? Copy(*other.rep_) : nullptr) {}
  Status(Status&& other) noexcept : code_(other.code_), rep_(std::exchange(other.rep_, nullptr)) {}
  Status& operator=(Status other) noexcept {
    std::swap(code_, other.code_);
    std::swap(rep_, other.rep_);
    return *this;
  }
  ~Status() {
    if (rep_ != nullptr) Drop(rep_);
  }

  static Status Ok() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return rep_ != nullptr ? rep_->message : NoMessage(); }

  /// "data error: <message>", or "ok".
  std::string ToString() const;

  /// Returns a copy whose message is "<context>: <message>" (detail kept).
  Status WithContext(const std::string& context) const;
  /// Returns a copy whose message is `message`, its code, detail and
  /// os_error kept.
  Status WithMessage(std::string message) const;

  /// Returns a copy carrying `detail` (null: none). REQUIRES: !ok().
  Status WithDetail(std::shared_ptr<const StatusDetail> detail) const;
  /// The detail attached by WithDetail, or null.
  const std::shared_ptr<const StatusDetail>& detail() const;
  /// The errno of the system call that failed (ErrnoError), kept through
  /// WithContext and WithDetail; 0 where none is known.
  int os_error() const { return rep_ != nullptr ? rep_->os_error : 0; }
  /// Returns a copy carrying `os_error`. REQUIRES: !ok().
  Status WithOsError(int os_error) const;

 private:
  struct Rep {
    std::string message;
    std::shared_ptr<const StatusDetail> detail;
    int os_error = 0;
  };
  // Out of line: only errors pay for them.
  static Rep* Make(std::string message);
  static Rep* Copy(const Rep& rep);
  static void Drop(Rep* rep);
  static const std::string& NoMessage();

  StatusCode code_ = StatusCode::kOk;
  Rep* rep_ = nullptr;  // owned; null for ok (and once moved from)
};

inline Status InvalidArgument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status DataError(std::string m) { return {StatusCode::kDataError, std::move(m)}; }
inline Status Unsupported(std::string m) { return {StatusCode::kUnsupported, std::move(m)}; }
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
inline Status Cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

/// Builds an error from errno: "<what>: <strerror(err)>". Missing paths are
/// kNotFound; a refused resource (EMFILE, ENFILE, ENOMEM, EAGAIN, ENOBUFS) or
/// a store gone or out of reach (ENOTCONN, ESTALE, ETIMEDOUT, network errnos,
/// removed media) is kUnavailable; the rest kIoError.
Status ErrnoError(const std::string& what, int err);

/// True when `status` is about the sample itself (missing, unreadable,
/// corrupt, unsupported, over a per-sample cap or past the data set's end): what the skip policy
/// may leave out. A refused machine resource, a stop or a bug is never the sample's fault, and
/// never skipped.
bool IsSampleError(const Status& status);

/// A value of type T, or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}         // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {  // NOLINT: implicit by design
    assert(!status_.ok() && "a Result made from a Status must carry an error");
  }

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }

  /// REQUIRES: ok().
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace stoker

#define STOKER_CONCAT_INNER(a, b) a##b
#define STOKER_CONCAT(a, b) STOKER_CONCAT_INNER(a, b)

/// Returns the Status of `expr` from the enclosing function if it is an error.
#define STOKER_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::stoker::Status stoker_status_ = (expr);        \
    if (!stoker_status_.ok()) return stoker_status_; \
  } while (0)

/// Evaluates `rexpr` (a Result<T>); on error returns its Status, else moves
/// the value into `lhs` (which may be a declaration).
#define STOKER_ASSIGN_OR_RETURN(lhs, rexpr) \
  STOKER_ASSIGN_OR_RETURN_IMPL(STOKER_CONCAT(stoker_result_, __LINE__), lhs, rexpr)
#define STOKER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
