#include "stoker/status.h"

#include <sys/resource.h>

#include <cassert>
#include <cerrno>
#include <cstring>

namespace stoker {

const char* StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kIoError:
      return "I/O error";
    case StatusCode::kDataError:
      return "data error";
    case StatusCode::kUnsupported:
      return "unsupported";
    case StatusCode::kResourceExhausted:
      return "resource exhausted";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kOutOfRange:
      return "out of range";
    case StatusCode::kInternal:
      return "internal error";
  }
  return "unknown";
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(StatusCodeName(code_)) + ": " + message();
}

Status Status::WithContext(const std::string& context) const {
  if (ok()) return *this;
  return WithMessage(context + ": " + message());
}

Status Status::WithMessage(std::string message) const {
  if (ok()) return *this;
  Status s = *this;
  s.rep_->message = std::move(message);
  return s;
}

Status Status::WithOsError(int os_error) const {
  assert(!ok());
  Status s = *this;
  if (s.rep_ == nullptr) s.rep_ = Make("");
  s.rep_->os_error = os_error;
  return s;
}

Status Status::WithDetail(std::shared_ptr<const StatusDetail> detail) const {
  assert(!ok());
  Status s = *this;
  if (s.rep_ == nullptr) s.rep_ = Make("");
  s.rep_->detail = std::move(detail);
  return s;
}

const std::shared_ptr<const StatusDetail>& Status::detail() const {
  static const std::shared_ptr<const StatusDetail> kNone;
  return rep_ != nullptr ? rep_->detail : kNone;
}

Status::Rep* Status::Make(std::string message) { return new Rep{std::move(message), {}}; }

Status::Rep* Status::Copy(const Rep& rep) { return new Rep(rep); }

void Status::Drop(Rep* rep) { delete rep; }

const std::string& Status::NoMessage() {
  static const std::string kNoMessage;
  return kNoMessage;
}

Status ErrnoError(const std::string& what, int err) {
  StatusCode code = StatusCode::kIoError;
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      code = StatusCode::kNotFound;
      break;
    // The machine refused a resource, or the store itself is gone or out of
    // reach (a FUSE server that died, an NFS or network store, removed
    // media): no sample's fault, and every other read would fail alike, so
    // such errors are never skipped as bad samples.
    case EMFILE:
    case ENFILE:
    case ENOMEM:
    case EAGAIN:
    case ENOBUFS:
    case ENOTCONN:
    case ESTALE:
    case ENODEV:
    case ENXIO:
    case ENOMEDIUM:
    case ETIMEDOUT:
    case ECONNREFUSED:
    case ECONNRESET:
    case ECONNABORTED:
    case EHOSTDOWN:
    case EHOSTUNREACH:
    case ENETDOWN:
    case ENETUNREACH:
    case ENETRESET:
    case ENOLINK:
      code = StatusCode::kUnavailable;
      break;
  }
  std::string text = what + ": " + std::strerror(err);
  // Which limit was met, and the way out.
  if (struct rlimit lim{}; err == EMFILE && getrlimit(RLIMIT_NOFILE, &lim) == 0) {
    text += " (the open-file limit, RLIMIT_NOFILE, is " + std::to_string(lim.rlim_cur) +
            ": raise it with ulimit -n, or hold fewer batches at once)";
  } else if (err == ENFILE) {
    text += " (the system's table of open files is full)";
  }
  return Status(code, text).WithOsError(err);
}

bool IsSampleError(const Status& status) {
  switch (status.code()) {
    case StatusCode::kNotFound:
    case StatusCode::kIoError:
    case StatusCode::kDataError:
    case StatusCode::kUnsupported:
    case StatusCode::kResourceExhausted:
    case StatusCode::kOutOfRange:
      return true;
    default:
      return false;
  }
}

}  // namespace stoker
