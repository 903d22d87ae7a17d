#include "stoker/status.h"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <memory>

namespace stoker {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("x=" + std::to_string(x) + " is odd");
  return x / 2;
}

Result<int> Quarter(int x) {
  STOKER_ASSIGN_OR_RETURN(int h, Half(x));
  STOKER_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST(StatusTest, OkAndError) {
  EXPECT_TRUE(Status::Ok().ok());
  Status s = DataError("truncated JPEG");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kDataError);
  EXPECT_EQ(s.ToString(), "data error: truncated JPEG");
  EXPECT_EQ(s.WithContext("sample 3 (a.jpg)").ToString(),
            "data error: sample 3 (a.jpg): truncated JPEG");
}

TEST(StatusTest, DetailTravelsWithCopiesAndContext) {
  struct Mark : StatusDetail {
    int value = 7;
  };
  const Status plain = DataError("truncated JPEG");
  EXPECT_EQ(plain.detail(), nullptr);
  const Status marked = plain.WithDetail(std::make_shared<Mark>());
  EXPECT_EQ(plain.detail(), nullptr);  // a copy carries it, the original does not
  const Status named = marked.WithContext("sample 3");
  EXPECT_EQ(named.ToString(), "data error: sample 3: truncated JPEG");
  ASSERT_NE(named.detail(), nullptr);
  EXPECT_EQ(dynamic_cast<const Mark&>(*named.detail()).value, 7);
  EXPECT_EQ(named.detail(), marked.detail());  // shared, not copied
}

TEST(StatusTest, ResultPropagates) {
  EXPECT_EQ(*Quarter(8), 2);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "x=3 is odd");
}

TEST(StatusTest, ASystemCallsErrnoIsKeptThroughContextAndDetail) {
  // Python raises it as the errno's own OSError (PermissionError for EACCES).
  const Status st = ErrnoError("open a", EACCES);
  EXPECT_EQ(st.os_error(), EACCES);
  EXPECT_EQ(st.WithContext("sample 3").os_error(), EACCES);
  EXPECT_EQ(st.WithDetail(nullptr).os_error(), EACCES);
  EXPECT_EQ(Status(st).os_error(), EACCES);
  EXPECT_EQ(IoError("no errno").os_error(), 0);
  EXPECT_EQ(Status::Ok().os_error(), 0);
}

TEST(StatusTest, RefusedResourcesAreNotTheSamplesFault) {
  EXPECT_EQ(ErrnoError("open a", EMFILE).code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoError("read a", ENOMEM).code(), StatusCode::kUnavailable);
  EXPECT_EQ(ErrnoError("open a", ENOENT).code(), StatusCode::kNotFound);
  EXPECT_EQ(ErrnoError("read a", EIO).code(), StatusCode::kIoError);
  EXPECT_FALSE(IsSampleError(ErrnoError("open a", EMFILE)));
  // A store that is gone or out of reach fails every read alike.
  for (int err : {ENOTCONN, ESTALE, ENODEV, ENXIO, ENOMEDIUM, ETIMEDOUT, ECONNRESET, EHOSTDOWN,
                  ENETUNREACH}) {
    EXPECT_FALSE(IsSampleError(ErrnoError("open a", err))) << std::strerror(err);
  }
  EXPECT_TRUE(IsSampleError(ErrnoError("open a", EACCES)));  // that file's permissions
  EXPECT_FALSE(IsSampleError(Unavailable("no thread")));
  EXPECT_FALSE(IsSampleError(Internal("bug")));
  EXPECT_FALSE(IsSampleError(Cancelled("stop")));
  EXPECT_TRUE(IsSampleError(DataError("bad")));
  EXPECT_TRUE(IsSampleError(ErrnoError("read a", EIO)));
  EXPECT_TRUE(IsSampleError(ResourceExhausted("over max_pixels")));
  EXPECT_TRUE(IsSampleError(OutOfRange("index 9 of 9")));  // skippable, as a bad file
}

TEST(StatusTest, ErrnoNamesTheFile) {
  Status s = ErrnoError("open /x/y.jpg", ENOENT);
  EXPECT_EQ(s.code(), StatusCode::kNotFound);
  EXPECT_NE(s.message().find("/x/y.jpg"), std::string::npos);
  EXPECT_EQ(ErrnoError("read a", EACCES).code(), StatusCode::kIoError);
}

}  // namespace
}  // namespace stoker
