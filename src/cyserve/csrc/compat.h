/* compat.h: small portability and annotation helpers shared by every csrc/ module.
 *
 * Nothing here may include Python.h: csrc/ is a C runtime that builds and tests with a plain
 * C compiler. Macros are for constants, branch hints and container_of only (STYLE.md 2(b).10). */
#ifndef CYSERVE_COMPAT_H
#define CYSERVE_COMPAT_H

#include <stddef.h>
#include <stdint.h>

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define ALWAYS_INLINE inline __attribute__((always_inline))
#define NOINLINE __attribute__((noinline))
#define N_ELEMENTS(a) (sizeof(a) / sizeof((a)[0]))
#define container_of(ptr, type, member) ((type *)((char *)(ptr) - offsetof(type, member)))
#define CACHE_LINE 64
#define CACHE_ALIGNED __attribute__((aligned(CACHE_LINE)))

/* Sanitizer detection, for both gcc (__SANITIZE_*__) and clang (__has_feature). */
#if defined(__SANITIZE_ADDRESS__)
#define CYSERVE_ASAN 1
#endif
#if defined(__SANITIZE_THREAD__)
#define CYSERVE_TSAN 1
#endif
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CYSERVE_ASAN 1
#endif
#if __has_feature(thread_sanitizer)
#define CYSERVE_TSAN 1
#endif
#endif

/* An order ThreadSanitizer cannot see, told to it: TSAN_RELEASE(p) on one thread, then
 * TSAN_ACQUIRE(p) on another, makes what the first did before happen before what the second does
 * after. Only for an order that holds through code TSan does not instrument (the interpreter's
 * own reference counting, say), with a comment saying which; nothing otherwise. */
#ifdef CYSERVE_TSAN
void __tsan_acquire(void *addr);
void __tsan_release(void *addr);
#define TSAN_ACQUIRE(p) __tsan_acquire((void *)(p))
#define TSAN_RELEASE(p) __tsan_release((void *)(p))
#else
#define TSAN_ACQUIRE(p) ((void)0)
#define TSAN_RELEASE(p) ((void)0)
#endif

#endif
