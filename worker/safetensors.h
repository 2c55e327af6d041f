/* safetensors files: the tensor container of Hugging Face and most tools.
 *
 * Layout: 8-byte little-endian header length N, then N bytes of JSON
 * {"NAME": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "string", ...}} padded with spaces to a multiple of
 * 8, then the data section; offsets are relative to the data section's start,
 * tensors are stored back to back with no holes, little-endian, row-major.
 *
 * Used for the checkpoint shards (one file per rank, see checkpoint.h) and for
 * the model export (st_write with Hugging Face names from api/model.h).
 *
 * The writer streams the data through SHA-256 (OpenSSL) so callers get the
 * file's checksum without reading it again. It can convert F32 memory to BF16
 * on the fly (round to nearest even) and transpose 2-D tensors (GPT-2's HF
 * Conv1D weights are stored [in, out] while engines keep [out, in]).
 *
 * Errors: 0 or a negative ST_E* code, with one message in the caller's `err`
 * buffer (may be NULL); nothing is logged. Objects are not shared between
 * threads. */
#ifndef LOOM_WORKER_SAFETENSORS_H
#define LOOM_WORKER_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

/* ST_EHEADER: the 8-byte header length is impossible for the file (under
 * 2, over 100 MiB, or past the end: a truncated or foreign file); ST_EDTYPE:
 * a tensor's dtype is not one of st_dtype's names (e.g. "F8_E4M3"); every
 * other malformed header or data section is ST_EFORMAT. */
enum {
    ST_EINVAL = -1,
    ST_EIO = -2,
    ST_EFORMAT = -3,
    ST_ENOTFOUND = -4,
    ST_EHEADER = -5,
    ST_EDTYPE = -6
};

enum st_dtype {
    ST_F64,
    ST_F32,
    ST_F16,
    ST_BF16,
    ST_I64,
    ST_I32,
    ST_I16,
    ST_I8,
    ST_U64,
    ST_U32,
    ST_U16,
    ST_U8,
    ST_BOOL,
    ST_NDTYPES
};

#define ST_MAX_DIMS 8

/* "F32", "BF16", ...; NULL for an invalid value. */
const char *st_dtype_name(enum st_dtype d);
/* Bytes per element, 0 for an invalid value. */
size_t st_dtype_size(enum st_dtype d);
/* Parse a dtype name; returns -1 when unknown. */
int st_dtype_parse(const char *name);

/* fp32 <-> bf16 and fp16 (round to nearest even; NaN stays NaN; fp16
 * overflows to infinity, subnormals are kept). Every bf16 / fp16 value is
 * exact in fp32, so a round trip from the narrow type gives the same bits. */
uint16_t st_f32_to_bf16(float f);
float st_bf16_to_f32(uint16_t h);
uint16_t st_f32_to_f16(float f);
float st_f16_to_f32(uint16_t h);

/* One tensor to write. `data` holds prod(shape) elements of `src_dtype`
 * (row-major); it is written as `dtype`: the same dtype, or F32 -> BF16 / F16.
 * With transpose = 1 (2-D only) the memory is [shape[1]][shape[0]] and is
 * written transposed, i.e. the file gets shape [shape[0], shape[1]]. */
struct st_tensor {
    const char *name;
    enum st_dtype dtype;
    enum st_dtype src_dtype;
    int ndim; /* 0 (scalar) .. ST_MAX_DIMS */
    int64_t shape[ST_MAX_DIMS];
    const void *data;
    int transpose;
};

/* Write tensors t[0..n) to `path` (via "path.tmp", fsynced, renamed; the
 * parent directory is not fsynced). `metadata` (may be NULL) is an object of
 * string values stored as "__metadata__". Names must be unique and not
 * "__metadata__". On success stores the file's SHA-256 (sha256, may be NULL)
 * and size (bytes, may be NULL). */
int st_write(const char *path, const struct st_tensor *t, size_t n, const json_t *metadata,
             unsigned char sha256[32], uint64_t *bytes, char *err, size_t errlen);

/* A parsed file: header validated (JSON, dtypes, shapes match the byte
 * ranges, ranges contiguous from 0 and ending exactly at the file's end). */
struct st_file;

struct st_info {
    const char *name; /* owned by the st_file */
    enum st_dtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    uint64_t offset; /* absolute file offset of the first byte */
    uint64_t nbytes;
};

int st_open(const char *path, struct st_file **out, char *err, size_t errlen);
void st_close(struct st_file *f); /* accepts NULL */
size_t st_count(const struct st_file *f);
const struct st_info *st_at(const struct st_file *f, size_t i); /* file order */
const struct st_info *st_find(const struct st_file *f, const char *name);
/* The bytes of tensor `in` (of this file) through a read-only shared
 * mapping of the whole file, made on the first call and kept until
 * st_close: only the pages a caller touches are read from disk, so a rank
 * that copies its slices of a large model never reads the rest. NULL when
 * the mapping fails (message in err). */
const void *st_data(struct st_file *f, const struct st_info *in, char *err, size_t errlen);
/* Drop the mapping's pages of tensor `in` from this process (madvise
 * MADV_DONTNEED; the file's pages stay in the page cache, evictable), after
 * its bytes were used, so that reading a model tensor by tensor never keeps
 * the model resident. No-op without a mapping. */
void st_release(struct st_file *f, const struct st_info *in);
/* "__metadata__" object (borrowed; NULL when absent). */
const json_t *st_metadata(const struct st_file *f);
/* Read tensor `name` into dst as `dtype`: the stored dtype, or F32 from a BF16
 * tensor. dst_bytes must equal the converted size exactly. */
int st_read(const struct st_file *f, const char *name, enum st_dtype dtype, void *dst,
            size_t dst_bytes, char *err, size_t errlen);

/* Export a model's full (tp = 1) fp32 parameters, laid out by `layout`
 * (api/model.h; its names are the Hugging Face ones), to `path` as F32 or
 * BF16 for other tools: GPT-2 linear weights are written transposed to HF's
 * Conv1D [in, out]; embedding and lm_head rows are cut from padded_vocab to
 * vocab_size; a tied GPT-2 head is not written (HF ties lm_head to wte);
 * "__metadata__" is {"format": "pt"} (transformers requires it) plus
 * `metadata`'s string entries (may be NULL). */
struct model_config;
struct model_layout;
int st_export_model(const char *path, const struct model_config *c,
                    const struct model_layout *layout, const float *params, enum st_dtype dtype,
                    const json_t *metadata, char *err, size_t errlen);

/* SHA-256 of a whole file as 64 lower-case hex digits plus NUL in hex[65];
 * also its size. Returns 0 or ST_EIO. */
int st_sha256_file(const char *path, char hex[65], uint64_t *bytes, char *err, size_t errlen);
/* 32 raw bytes -> 64 hex digits + NUL. */
void st_hex(const unsigned char sha256[32], char hex[65]);

#endif
