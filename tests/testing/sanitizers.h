#pragma once

// STOKER_SANITIZED is defined when the test is built with a sanitizer whose
// runtime a test cannot live with (address-space caps, fork() of a threaded
// process): such tests skip themselves.

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STOKER_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define STOKER_SANITIZED 1
#endif
#endif
