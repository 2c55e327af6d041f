/* A growable byte buffer in the style of git's strbuf: one struct, grown by
 * doubling, always NUL-terminated once it holds storage, so p can be used as
 * a C string. Not thread-safe; one owner at a time.
 *
 *     struct buf b = BUF_INIT;
 *     if (buf_printf(&b, "%d items", n) != 0) goto out;   // -1: out of memory
 *     char *s = buf_release(&b);                          // caller frees s
 *
 * Every function that can fail returns 0 or -1 (out of memory or a size that
 * would overflow) and leaves the buffer as it was on failure. */
#ifndef LOOM_COMMON_BUF_H
#define LOOM_COMMON_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct buf {
    char *p;    /* NULL until the first growth; then NUL-terminated at p[len] */
    size_t len; /* bytes held, not counting the NUL */
    size_t cap; /* bytes allocated at p */
};

#define BUF_INIT                                                                                   \
    { NULL, 0, 0 }

/* An empty buffer with no storage (same as BUF_INIT). */
void buf_init(struct buf *b);
/* Room for `extra` more bytes plus the NUL; the length does not change. */
int buf_reserve(struct buf *b, size_t extra);
int buf_append(struct buf *b, const void *data, size_t n);
int buf_append_str(struct buf *b, const char *s);
int buf_append_ch(struct buf *b, char c);
int buf_printf(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int buf_vprintf(struct buf *b, const char *fmt, va_list ap) __attribute__((format(printf, 2, 0)));
/* Length 0, storage kept. */
void buf_reset(struct buf *b);
/* Hands the bytes to the caller (free() them) and leaves b empty. An empty
 * buffer gives an allocated "" (NULL only when that allocation fails). */
char *buf_release(struct buf *b);
/* Frees the storage and leaves b empty; NULL is accepted. */
void buf_free(struct buf *b);

/* Grows the array *arr of *cap elements of `size` bytes (doubling, at least
 * `min_cap` on the first growth) until it holds `need` elements. The common
 * body of the "if (n == cap) realloc(cap * 2)" loops over typed arrays;
 * new elements are not initialised. 0 or -1 (arrays unchanged). */
int buf_grow_array(void *arr, size_t *cap, size_t need, size_t size, size_t min_cap);
/* The same for an array pointer `arr` whose capacity `cap` is an lvalue of
 * any integer type: BUF_GROW(o->q, o->capq, o->nq + 1, 64) is 0 or -1. */
#define BUF_GROW(arr, cap, need, min_cap)                                                          \
    (__extension__({                                                                               \
        size_t buf_cap_ = (size_t)(cap);                                                           \
        int buf_rc_ = buf_grow_array(&(arr), &buf_cap_, (size_t)(need), sizeof *(arr), (min_cap)); \
        if (buf_rc_ == 0) (cap) = buf_cap_;                                                        \
        buf_rc_;                                                                                   \
    }))

#endif
