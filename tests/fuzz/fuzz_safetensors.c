/* libFuzzer target for the safetensors reader (worker/safetensors.c st_open,
 * st_data), which reads checkpoints, HF weights and init_from files. The
 * input becomes a memory file; a refusal must come with a message, an
 * accepted file must describe tensors that lie inside the file after the
 * header, with nbytes = product(shape) * dtype size, and each
 * tensor's bytes must be readable. Tests/fuzz/fuzz_data.c covers the same
 * reader with fixed-seed mutations in every build; this one is
 * coverage-guided (LOOM_FUZZ=ON with clang, tests/fuzz.cmake). */
#define _GNU_SOURCE /* memfd_create */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "worker/safetensors.h"

static void fail(const char *what, const char *name) {
    fprintf(stderr, "fuzz_safetensors: %s (tensor %s)\n", what, name ? name : "-");
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    int fd = memfd_create("fuzz.safetensors", MFD_CLOEXEC);
    if (fd < 0) return 0;
    if (size && write(fd, data, size) != (ssize_t)size) {
        close(fd);
        return 0;
    }
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    struct st_file *f = NULL;
    if (st_open(path, &f, err, sizeof err) != 0) {
        if (!err[0]) fail("refused without a message", NULL);
        close(fd);
        return 0;
    }
    uint64_t hlen = 0;
    for (int i = 0; i < 8 && (size_t)i < size; i++)
        hlen |= (uint64_t)data[i] << (8 * i);
    for (size_t i = 0; i < st_count(f); i++) {
        const struct st_info *in = st_at(f, i);
        if (!in || !in->name) fail("no info", NULL);
        if (in->offset < 8 + hlen || in->offset > size || in->nbytes > size - in->offset)
            fail("range outside the data section", in->name);
        uint64_t n = st_dtype_size(in->dtype);
        for (int d = 0; d < in->ndim; d++)
            n *= (uint64_t)in->shape[d];
        if (n != in->nbytes) fail("nbytes is not product(shape) * dtype size", in->name);
        if (st_find(f, in->name) != in) fail("st_find does not find the tensor", in->name);
        const void *p = st_data(f, in, err, sizeof err);
        if (!p && in->nbytes) fail("accepted tensor unreadable", in->name);
        if (p && in->nbytes && memcmp(p, data + in->offset, (size_t)in->nbytes) != 0)
            fail("st_data bytes differ from the file", in->name);
        if (p) st_release(f, in);
    }
    st_close(f);
    close(fd);
    return 0;
}
