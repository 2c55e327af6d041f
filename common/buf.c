/* Growable byte buffer and array growth (see buf.h). Capacities double from
 * a small start so appends are amortised O(1); every size computation is
 * checked for overflow before it is used. */
#include "common/buf.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUF_MIN_CAP 64

void buf_init(struct buf *b) {
    b->p = NULL;
    b->len = b->cap = 0;
}

/* The capacity that holds `need` bytes: cap doubled until it does. */
static int next_cap(size_t cap, size_t need, size_t min_cap, size_t *out) {
    if (cap < min_cap) cap = min_cap;
    while (cap < need) {
        if (cap > SIZE_MAX / 2) return -1;
        cap *= 2;
    }
    *out = cap;
    return 0;
}

int buf_reserve(struct buf *b, size_t extra) {
    if (extra > SIZE_MAX - 1 - b->len) return -1;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return 0;
    size_t cap;
    if (next_cap(b->cap, need, BUF_MIN_CAP, &cap) != 0) return -1;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    if (!b->p) p[0] = '\0';
    b->p = p;
    b->cap = cap;
    return 0;
}

int buf_append(struct buf *b, const void *data, size_t n) {
    if (buf_reserve(b, n) != 0) return -1;
    if (n) memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

int buf_append_str(struct buf *b, const char *s) {
    return buf_append(b, s, strlen(s));
}

int buf_append_ch(struct buf *b, char c) {
    return buf_append(b, &c, 1);
}

int buf_vprintf(struct buf *b, const char *fmt, va_list ap) {
    va_list ap2;
    va_copy(ap2, ap);
    /* First try in the room already there; a second pass only when it did not fit. */
    size_t room = b->cap > b->len ? b->cap - b->len : 0;
    int n = vsnprintf(room ? b->p + b->len : NULL, room, fmt, ap2);
    va_end(ap2);
    if (n < 0) return -1;
    if ((size_t)n >= room) {
        if (buf_reserve(b, (size_t)n) != 0) {
            if (b->p) b->p[b->len] = '\0';
            return -1;
        }
        va_copy(ap2, ap);
        vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap2);
        va_end(ap2);
    }
    b->len += (size_t)n;
    return 0;
}

int buf_printf(struct buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int rc = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void buf_reset(struct buf *b) {
    b->len = 0;
    if (b->p) b->p[0] = '\0';
}

char *buf_release(struct buf *b) {
    char *p = b->p ? b->p : calloc(1, 1);
    buf_init(b);
    return p;
}

void buf_free(struct buf *b) {
    if (!b) return;
    free(b->p);
    buf_init(b);
}

int buf_grow_array(void *arr, size_t *cap, size_t need, size_t size, size_t min_cap) {
    if (need <= *cap) return 0;
    size_t ncap;
    if (next_cap(*cap, need, min_cap ? min_cap : 1, &ncap) != 0) return -1;
    if (size && ncap > SIZE_MAX / size) return -1;
    /* arr points at a T* of the caller's type: read and write it with memcpy,
     * not through a void **, so no pointer object is accessed as another type. */
    void *old, *p;
    memcpy(&old, arr, sizeof old);
    p = realloc(old, ncap * size);
    if (!p) return -1;
    memcpy(arr, &p, sizeof p);
    *cap = ncap;
    return 0;
}
