/* The comm layer (see comm.h): worlds, communicators, the rank layout, the
 * background thread that runs asynchronous operations in issue order, error
 * latching, and the "local" backend for groups of one.
 *
 * Design: backends are synchronous (comm_backend.h). A blocking call with
 * nothing queued runs inline on the caller's thread; otherwise the operation
 * is queued to the comm's own thread (started on first use), so collectives
 * of a comm always execute in the order they were issued, which is what
 * makes the ranks agree. The first failure is latched: the message is
 * logged once, and every queued or later operation fails at once instead of
 * talking to peers that are gone. */
#include "worker/comm/comm.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/comm/comm_backend.h"

/* ---- types and small helpers */

size_t comm_dtype_size(enum comm_dtype dt) {
    switch (dt) {
    case COMM_F32:
    case COMM_I32:
        return 4;
    case COMM_F64:
    case COMM_I64:
        return 8;
    case COMM_BF16:
    case COMM_F16:
        return 2;
    case COMM_U8:
        return 1;
    }
    return 0;
}

const char *comm_dtype_name(enum comm_dtype dt) {
    static const char *names[] = {"f32", "f64", "bf16", "f16", "i32", "i64", "u8"};
    return (unsigned)dt < sizeof(names) / sizeof(names[0]) ? names[dt] : "?";
}

void comm_shard_range(size_t total, int n, int idx, size_t *off, size_t *cnt) {
    size_t base = total / (size_t)n, extra = total % (size_t)n, i = (size_t)idx;
    *cnt = base + (i < extra ? 1 : 0);
    *off = i * base + (i < extra ? i : extra);
}

void comm_layout_coords(const struct comm_layout *l, int rank, int *tp_idx, int *dp_idx,
                        int *pp_idx) {
    if (tp_idx) *tp_idx = rank % l->tp;
    if (dp_idx) *dp_idx = (rank / l->tp) % l->dp;
    if (pp_idx) *pp_idx = rank / (l->tp * l->dp);
}

int comm_layout_rank(const struct comm_layout *l, int tp_idx, int dp_idx, int pp_idx) {
    return pp_idx * l->dp * l->tp + dp_idx * l->tp + tp_idx;
}

int comm_layout_group(const struct comm_layout *l, int rank, enum comm_axis axis, int *ranks) {
    int t, d, p;
    comm_layout_coords(l, rank, &t, &d, &p);
    int n = axis == COMM_AXIS_TP ? l->tp : axis == COMM_AXIS_DP ? l->dp : l->pp;
    for (int i = 0; i < n; i++) {
        ranks[i] = axis == COMM_AXIS_TP   ? comm_layout_rank(l, i, d, p)
                   : axis == COMM_AXIS_DP ? comm_layout_rank(l, t, i, p)
                                          : comm_layout_rank(l, t, d, i);
    }
    return n;
}

/* ---- world */

/* Comm names seen so far and how often, so that a name reused after
 * comm_free (e.g. "world" made twice) gets fresh rendezvous keys. */
struct comm_name_count {
    char name[96];
    int count;
};

struct comm_world {
    struct comm_backend_world bw;
    const struct comm_backend_ops *ops;
    void *impl;
    struct comm_name_count *names;
    int nnames;
};

int comm_world_opts_from_env(struct comm_world_opts *o) {
    const char *s;
    int found = 0;
    if ((s = getenv("LOOM_RANK")) && *s) o->rank = atoi(s);
    if ((s = getenv("LOOM_WORLD")) && *s) {
        o->world = atoi(s);
        found = 1;
    }
    if ((s = getenv("LOOM_RDZV")) && *s) o->rdzv = s;
    if ((s = getenv("LOOM_RDZV_TOKEN")) && *s) o->token = s;
    if ((s = getenv("LOOM_COMM_TIMEOUT_MS")) && *s) o->timeout_ms = atoi(s);
    /* the comm rows of loom-worker's table by the same names, for programs
     * without that table (the node check probe) */
    if ((s = getenv("LOOM_COMM_IFACE")) && *s) o->iface = s;
    if ((s = getenv("LOOM_COMM_HOST")) && *s) o->host = s;
    if ((s = getenv("LOOM_NCCL_STREAM_PRIORITY")) && *s) o->nccl_stream_priority = s;
    if ((s = getenv("LOOM_NCCL_CTA_POLICY")) && *s) o->nccl_cta_policy = s;
    return found;
}

static const struct comm_backend_ops *backend_by_name(const char *name, char *err, size_t errlen) {
    if (strcmp(name, "local") == 0) return comm_backend_local();
    if (strcmp(name, "gloo") == 0) {
#ifdef LOOM_HAVE_GLOO
        return comm_backend_gloo();
#else
        snprintf(err, errlen,
                 "comm: this loom-worker was built without Gloo (libgloo-dev missing at "
                 "configure time); cpu runs with more than one rank need it");
        return NULL;
#endif
    }
    if (strcmp(name, "nccl") == 0) {
#ifdef LOOM_HAVE_NCCL
        return comm_backend_nccl();
#else
        snprintf(err, errlen, "comm: this loom-worker was built without CUDA/NCCL");
        return NULL;
#endif
    }
    snprintf(err, errlen, "comm: unknown backend '%s' (want auto, local, gloo or nccl)", name);
    return NULL;
}

struct comm_world *comm_world_new(const struct comm_world_opts *o, char *err, size_t errlen) {
    struct comm_world *w = NULL;
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world) {
        snprintf(err, errlen, "comm: rank %d is not in a world of %d", o->rank, o->world);
        return NULL;
    }
    const char *dev = o->device ? o->device : "cpu";
    const char *name = o->backend && strcmp(o->backend, "auto") != 0 ? o->backend
                       : strcmp(dev, "cuda") == 0                    ? "nccl"
                       : o->world == 1                               ? "local"
                                                                     : "gloo";
    if (strcmp(name, "local") == 0 && o->world != 1) {
        snprintf(err, errlen, "comm: backend local serves a world of 1, not %d", o->world);
        return NULL;
    }
    const struct comm_backend_ops *ops = backend_by_name(name, err, errlen);
    if (!ops) return NULL;
    w = calloc(1, sizeof(*w));
    if (!w) {
        snprintf(err, errlen, "comm: out of memory");
        return NULL;
    }
    w->ops = ops;
    w->bw.rank = o->rank;
    w->bw.size = o->world;
    w->bw.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : COMM_DEFAULT_TIMEOUT_MS;
    w->bw.cuda_device = o->cuda_device;
    snprintf(w->bw.iface, sizeof w->bw.iface, "%s", o->iface ? o->iface : "");
    snprintf(w->bw.host, sizeof w->bw.host, "%s", o->host ? o->host : "");
    snprintf(w->bw.nccl_stream_priority, sizeof w->bw.nccl_stream_priority, "%s",
             o->nccl_stream_priority ? o->nccl_stream_priority : "");
    snprintf(w->bw.nccl_cta_policy, sizeof w->bw.nccl_cta_policy, "%s",
             o->nccl_cta_policy ? o->nccl_cta_policy : "");
    if (o->world > 1) {
        /* A peer that dies closes its sockets; a later write to one raises
         * SIGPIPE, whose default action would kill this rank instead of
         * failing the operation with a message (seen: Gloo's TCP pairs, a
         * survivor killed by signal 13 in unit.comm.failure). Ignored unless
         * the process installed its own handler. */
        struct sigaction old_sa;
        if (sigaction(SIGPIPE, NULL, &old_sa) == 0 && old_sa.sa_handler == SIG_DFL)
            signal(SIGPIPE, SIG_IGN);
        w->bw.rdzv = rdzv_open(o->rdzv, o->token, err, errlen);
        if (!w->bw.rdzv) goto fail;
        w->bw.rdzv_is_file = strncmp(o->rdzv, "file:", 5) == 0;
    }
    if (ops->world_init) {
        w->impl = ops->world_init(&w->bw, err, errlen);
        if (!w->impl) goto fail;
    }
    return w;
fail:
    rdzv_free(w->bw.rdzv);
    free(w);
    return NULL;
}

void comm_world_free(struct comm_world *w) {
    if (!w) return;
    if (w->ops->world_fini) w->ops->world_fini(w->impl);
    rdzv_free(w->bw.rdzv);
    free(w->names);
    free(w);
}

int comm_world_rank(const struct comm_world *w) {
    return w->bw.rank;
}
int comm_world_size(const struct comm_world *w) {
    return w->bw.size;
}
const char *comm_world_backend(const struct comm_world *w) {
    return w->ops->name;
}

/* ---- communicators and the operation queue */

enum op_kind {
    OP_ALLREDUCE,
    OP_REDUCE_SCATTER,
    OP_ALL_GATHER,
    OP_BROADCAST,
    OP_BARRIER,
    OP_SEND,
    OP_RECV
};
static const char *op_names[] = {"allreduce", "reduce_scatter", "all_gather", "broadcast",
                                 "barrier",   "send",           "recv"};

struct comm_req {
    struct comm *c;
    enum op_kind kind;
    void *buf;
    const void *sbuf;
    size_t n;
    enum comm_dtype dt;
    enum comm_op op;
    int root;       /* broadcast root, p2p peer */
    size_t *counts; /* reduce_scatter / all_gather slices (owned) */
    void *p2p;
    int status, done;
    struct comm_req *next;
};

struct comm {
    struct comm_world *w;
    const struct comm_backend_ops *ops;
    void *impl;
    char name[128]; /* as given */
    char key[128];  /* name.generation: the rendezvous prefix */
    int rank, size;
    int *world_rank;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int thread_started, stopping;
    struct comm_req *head, *tail;
    int pending; /* queued + running on the thread */
    int broken;
    char err[768];
};

/* Latch the first error of a comm and log it once. */
static void comm_fail(struct comm *c, const struct comm_req *r, const char *msg) {
    pthread_mutex_lock(&c->mu);
    if (!c->broken) {
        c->broken = 1;
        snprintf(c->err, sizeof(c->err), "rank %d (world rank %d) comm %s: %s of %zu %s: %s",
                 c->rank, c->w->bw.rank, c->name, op_names[r->kind], r->n, comm_dtype_name(r->dt),
                 msg);
        log_error("%s", c->err);
    }
    pthread_mutex_unlock(&c->mu);
}

static int run_op(struct comm *c, struct comm_req *r) {
    char err[512] = "";
    int rc;
    switch (r->kind) {
    case OP_ALLREDUCE:
        rc = c->ops->allreduce(c->impl, r->buf, r->n, r->dt, r->op, err, sizeof(err));
        break;
    case OP_REDUCE_SCATTER:
        rc = c->ops->reduce_scatter(c->impl, r->sbuf, r->buf, r->n, r->counts, r->dt, r->op, err,
                                    sizeof(err));
        break;
    case OP_ALL_GATHER:
        rc = c->ops->all_gather(c->impl, r->sbuf, r->buf, r->n, r->counts, r->dt, err, sizeof(err));
        break;
    case OP_BROADCAST:
        rc = c->ops->broadcast(c->impl, r->buf, r->n, r->dt, r->root, err, sizeof(err));
        break;
    case OP_BARRIER:
        rc = c->ops->barrier(c->impl, err, sizeof(err));
        break;
    default:
        rc = -1;
        snprintf(err, sizeof(err), "not a queued operation");
    }
    if (rc != 0) comm_fail(c, r, err[0] ? err : "backend failed");
    return rc != 0 ? -1 : 0;
}

static void *comm_thread(void *arg) {
    struct comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->head && !c->stopping)
            pthread_cond_wait(&c->cv, &c->mu);
        if (!c->head) break;
        struct comm_req *r = c->head;
        c->head = r->next;
        if (!c->head) c->tail = NULL;
        int broken = c->broken;
        pthread_mutex_unlock(&c->mu);
        int rc = broken ? -1 : run_op(c, r);
        pthread_mutex_lock(&c->mu);
        r->status = rc;
        r->done = 1;
        c->pending--;
        pthread_cond_broadcast(&c->cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

static const struct comm_backend_ops *local_ops(void);

/* How many comms named `name` this world made before (-1: out of memory). */
static int name_generation(struct comm_world *w, const char *name) {
    for (int i = 0; i < w->nnames; i++)
        if (strncmp(w->names[i].name, name, sizeof(w->names[i].name) - 1) == 0)
            return w->names[i].count++;
    struct comm_name_count *n = realloc(w->names, sizeof(*n) * (size_t)(w->nnames + 1));
    if (!n) return -1;
    w->names = n;
    snprintf(n[w->nnames].name, sizeof(n[0].name), "%s", name);
    n[w->nnames].count = 1;
    w->nnames++;
    return 0;
}

struct comm *comm_new(struct comm_world *w, const char *name, const int *ranks, int n, char *err,
                      size_t errlen) {
    struct comm *c = NULL;
    int me = -1;
    for (int i = 0; i < n; i++) {
        if (ranks[i] < 0 || ranks[i] >= w->bw.size) {
            snprintf(err, errlen, "comm %s: rank %d is not in the world of %d", name, ranks[i],
                     w->bw.size);
            return NULL;
        }
        if (ranks[i] == w->bw.rank) me = i;
    }
    if (me < 0) {
        snprintf(err, errlen, "comm %s: world rank %d is not a member", name, w->bw.rank);
        return NULL;
    }
    c = calloc(1, sizeof(*c));
    if (!c || !(c->world_rank = malloc(sizeof(int) * (size_t)n))) {
        free(c);
        snprintf(err, errlen, "comm: out of memory");
        return NULL;
    }
    memcpy(c->world_rank, ranks, sizeof(int) * (size_t)n);
    c->w = w;
    c->rank = me;
    c->size = n;
    snprintf(c->name, sizeof(c->name), "%s", name);
    int gen = name_generation(w, name);
    if (gen < 0) {
        free(c->world_rank);
        free(c);
        snprintf(err, errlen, "comm: out of memory");
        return NULL;
    }
    snprintf(c->key, sizeof(c->key), "%s.%d", name, gen);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    /* A group of one needs no peers: host backends use the local copies; nccl
     * keeps its own (its buffers are device memory). */
    c->ops = n == 1 && strcmp(w->ops->name, "nccl") != 0 ? local_ops() : w->ops;
    struct comm_backend_comm bc = {&w->bw, w->impl, c->key, c->rank, c->size, c->world_rank};
    char berr[512] = "";
    c->impl = c->ops->comm_init(&bc, berr, sizeof(berr));
    if (!c->impl) {
        snprintf(err, errlen, "comm %s (rank %d of %d, world rank %d): %s", name, me, n, w->bw.rank,
                 berr);
        pthread_mutex_destroy(&c->mu);
        pthread_cond_destroy(&c->cv);
        free(c->world_rank);
        free(c);
        return NULL;
    }
    return c;
}

void comm_free(struct comm *c) {
    if (!c) return;
    pthread_mutex_lock(&c->mu);
    c->stopping = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->thread_started) pthread_join(c->thread, NULL);
    c->ops->comm_fini(c->impl);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    free(c->world_rank);
    free(c);
}

int comm_rank(const struct comm *c) {
    return c->rank;
}
int comm_size(const struct comm *c) {
    return c->size;
}
const char *comm_error(const struct comm *c) {
    return c->err;
}

/* Run r now (nothing queued) or queue it; with out == NULL wait for it. */
static int submit(struct comm *c, struct comm_req *tmpl, struct comm_req **out) {
    pthread_mutex_lock(&c->mu);
    if (c->broken) {
        pthread_mutex_unlock(&c->mu);
        if (out) *out = NULL;
        free(tmpl->counts);
        return -1;
    }
    if (!out && c->pending == 0) {
        pthread_mutex_unlock(&c->mu);
        int rc = run_op(c, tmpl);
        free(tmpl->counts);
        return rc;
    }
    struct comm_req *r = malloc(sizeof(*r));
    if (!r) {
        pthread_mutex_unlock(&c->mu);
        comm_fail(c, tmpl, "out of memory");
        free(tmpl->counts);
        return -1;
    }
    *r = *tmpl;
    r->c = c;
    if (!c->thread_started) {
        if (pthread_create(&c->thread, NULL, comm_thread, c) != 0) {
            pthread_mutex_unlock(&c->mu);
            free(r);
            comm_fail(c, tmpl, "cannot start the comm thread");
            free(tmpl->counts);
            return -1;
        }
        c->thread_started = 1;
    }
    if (c->tail)
        c->tail->next = r;
    else
        c->head = r;
    c->tail = r;
    c->pending++;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (out) {
        *out = r;
        return 0;
    }
    return comm_wait(r);
}

int comm_wait(struct comm_req *r) {
    if (!r) return 0;
    struct comm *c = r->c;
    int rc;
    if (r->kind == OP_SEND || r->kind == OP_RECV) {
        char err[512] = "";
        rc = c->ops->p2p_wait(c->impl, r->p2p, err, sizeof(err));
        if (rc != 0) comm_fail(c, r, err[0] ? err : "backend failed");
        rc = rc != 0 ? -1 : 0;
    } else {
        pthread_mutex_lock(&c->mu);
        while (!r->done)
            pthread_cond_wait(&c->cv, &c->mu);
        rc = r->status;
        pthread_mutex_unlock(&c->mu);
    }
    free(r->counts);
    free(r);
    return rc;
}

static int nothing_to_do(struct comm_req **req) {
    if (req) *req = NULL; /* comm_wait(NULL) returns 0 */
    return 0;
}

int comm_allreduce_stream(struct comm *c, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                          void *stream) {
    if (!c->ops->allreduce_stream) return 1;
    pthread_mutex_lock(&c->mu);
    int busy = c->pending > 0, broken = c->broken;
    pthread_mutex_unlock(&c->mu);
    if (broken) return -1;
    if (busy) return 1; /* the comm thread owns the communicator now */
    if (n == 0) return 0;
    char err[512];
    if (c->ops->allreduce_stream(c->impl, buf, n, dt, op, stream, err, sizeof(err)) != 0) {
        struct comm_req r = {.c = c, .kind = OP_ALLREDUCE, .buf = buf, .n = n, .dt = dt, .op = op};
        comm_fail(c, &r, err);
        return -1;
    }
    return 0;
}

int comm_allreduce(struct comm *c, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                   struct comm_req **req) {
    if (n == 0) return nothing_to_do(req);
    struct comm_req r = {.kind = OP_ALLREDUCE, .buf = buf, .n = n, .dt = dt, .op = op};
    return submit(c, &r, req);
}

/* counts for the balanced split of total, or a copy of the caller's. */
static size_t *make_counts(const struct comm *c, size_t total, const size_t *given) {
    size_t *cnt = malloc(sizeof(size_t) * (size_t)c->size);
    if (!cnt) return NULL;
    for (int i = 0; i < c->size; i++) {
        size_t off;
        if (given)
            cnt[i] = given[i];
        else
            comm_shard_range(total, c->size, i, &off, &cnt[i]);
    }
    return cnt;
}

static int sharded(struct comm *c, enum op_kind kind, const void *send, void *recv, size_t total,
                   const size_t *given, enum comm_dtype dt, enum comm_op op,
                   struct comm_req **req) {
    struct comm_req r = {.kind = kind, .sbuf = send, .buf = recv, .n = total, .dt = dt, .op = op};
    if (given) {
        total = 0;
        for (int i = 0; i < c->size; i++)
            total += given[i];
        r.n = total;
    }
    if (total == 0) return nothing_to_do(req);
    r.counts = make_counts(c, total, given);
    if (!r.counts) {
        comm_fail(c, &r, "out of memory");
        return -1;
    }
    return submit(c, &r, req);
}

int comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t total,
                        enum comm_dtype dt, enum comm_op op, struct comm_req **req) {
    return sharded(c, OP_REDUCE_SCATTER, send, recv, total, NULL, dt, op, req);
}

int comm_reduce_scatterv(struct comm *c, const void *send, void *recv, const size_t *counts,
                         enum comm_dtype dt, enum comm_op op, struct comm_req **req) {
    return sharded(c, OP_REDUCE_SCATTER, send, recv, 0, counts, dt, op, req);
}

int comm_all_gather(struct comm *c, const void *send, void *recv, size_t total, enum comm_dtype dt,
                    struct comm_req **req) {
    return sharded(c, OP_ALL_GATHER, send, recv, total, NULL, dt, COMM_SUM, req);
}

int comm_all_gatherv(struct comm *c, const void *send, void *recv, const size_t *counts,
                     enum comm_dtype dt, struct comm_req **req) {
    return sharded(c, OP_ALL_GATHER, send, recv, 0, counts, dt, COMM_SUM, req);
}

int comm_broadcast(struct comm *c, void *buf, size_t n, enum comm_dtype dt, int root,
                   struct comm_req **req) {
    struct comm_req r = {.kind = OP_BROADCAST, .buf = buf, .n = n, .dt = dt, .root = root};
    if (root < 0 || root >= c->size) {
        comm_fail(c, &r, "root out of range");
        return -1;
    }
    if (n == 0) return nothing_to_do(req);
    return submit(c, &r, req);
}

int comm_barrier(struct comm *c, struct comm_req **req) {
    struct comm_req r = {.kind = OP_BARRIER, .dt = COMM_U8};
    return submit(c, &r, req);
}

static int p2p(struct comm *c, enum op_kind kind, const void *sbuf, void *rbuf, size_t n,
               enum comm_dtype dt, int peer, struct comm_req **req) {
    struct comm_req t = {.kind = kind, .sbuf = sbuf, .buf = rbuf, .n = n, .dt = dt, .root = peer};
    if (peer < 0 || peer >= c->size || peer == c->rank) {
        comm_fail(&*c, &t, "peer out of range (or self)");
        return -1;
    }
    if (n == 0) return nothing_to_do(req);
    pthread_mutex_lock(&c->mu);
    int broken = c->broken;
    pthread_mutex_unlock(&c->mu);
    if (broken) return -1;
    struct comm_req *r = malloc(sizeof(*r));
    if (!r) {
        comm_fail(c, &t, "out of memory");
        return -1;
    }
    *r = t;
    r->c = c;
    char err[512] = "";
    size_t bytes = n * comm_dtype_size(dt);
    int rc = kind == OP_SEND ? c->ops->isend(c->impl, sbuf, bytes, peer, &r->p2p, err, sizeof(err))
                             : c->ops->irecv(c->impl, rbuf, bytes, peer, &r->p2p, err, sizeof(err));
    if (rc != 0) {
        comm_fail(c, r, err[0] ? err : "backend failed");
        free(r);
        return -1;
    }
    if (req) {
        *req = r;
        return 0;
    }
    return comm_wait(r);
}

int comm_send(struct comm *c, const void *buf, size_t n, enum comm_dtype dt, int peer,
              struct comm_req **req) {
    return p2p(c, OP_SEND, buf, NULL, n, dt, peer, req);
}

int comm_recv(struct comm *c, void *buf, size_t n, enum comm_dtype dt, int peer,
              struct comm_req **req) {
    return p2p(c, OP_RECV, NULL, buf, n, dt, peer, req);
}

int comm_sendrecv(struct comm *c, const void *sendbuf, size_t sn, int dst, void *recvbuf, size_t rn,
                  int src, enum comm_dtype dt) {
    if (c->ops->sendrecv && sn > 0 && rn > 0) {
        struct comm_req t = {.kind = OP_SEND, .sbuf = sendbuf, .buf = recvbuf, .n = sn, .dt = dt};
        if (dst < 0 || dst >= c->size || dst == c->rank || src < 0 || src >= c->size ||
            src == c->rank) {
            comm_fail(c, &t, "peer out of range (or self)");
            return -1;
        }
        size_t es = comm_dtype_size(dt);
        char err[512] = "";
        pthread_mutex_lock(&c->mu);
        int broken = c->broken;
        pthread_mutex_unlock(&c->mu);
        if (broken) return -1;
        if (c->ops->sendrecv(c->impl, sendbuf, sn * es, dst, recvbuf, rn * es, src, err,
                             sizeof(err)) != 0) {
            comm_fail(c, &t, err[0] ? err : "backend failed");
            return -1;
        }
        return 0;
    }
    struct comm_req *s = NULL, *r = NULL;
    int rc = comm_recv(c, recvbuf, rn, dt, src, &r);
    if (rc == 0) rc = comm_send(c, sendbuf, sn, dt, dst, &s);
    int rc1 = comm_wait(s), rc2 = comm_wait(r);
    return rc ? rc : rc1 ? rc1 : rc2;
}

/* ---- groups */

int comm_groups_init(struct comm_world *w, const struct comm_layout *l, struct comm_groups *g,
                     char *err, size_t errlen) {
    memset(g, 0, sizeof(*g));
    int n = l->tp * l->dp * l->pp;
    if (l->tp < 1 || l->dp < 1 || l->pp < 1 || n != w->bw.size) {
        snprintf(err, errlen, "comm: layout tp=%d dp=%d pp=%d (=%d ranks) does not match world %d",
                 l->tp, l->dp, l->pp, n, w->bw.size);
        return -1;
    }
    int *ranks = malloc(sizeof(int) * (size_t)n);
    if (!ranks) {
        snprintf(err, errlen, "comm: out of memory");
        return -1;
    }
    int t, d, p, cnt;
    char name[64];
    comm_layout_coords(l, w->bw.rank, &t, &d, &p);
    for (int i = 0; i < n; i++)
        ranks[i] = i;
    g->world = comm_new(w, "world", ranks, n, err, errlen);
    if (!g->world) goto fail;
    /* Same creation order on every rank: the groups of each kind partition the
     * world, so no rank waits on a group whose members are elsewhere. */
    cnt = comm_layout_group(l, w->bw.rank, COMM_AXIS_TP, ranks);
    snprintf(name, sizeof(name), "tp.pp%d.dp%d", p, d);
    if (!(g->tp = comm_new(w, name, ranks, cnt, err, errlen))) goto fail;
    cnt = comm_layout_group(l, w->bw.rank, COMM_AXIS_DP, ranks);
    snprintf(name, sizeof(name), "dp.pp%d.tp%d", p, t);
    if (!(g->dp = comm_new(w, name, ranks, cnt, err, errlen))) goto fail;
    cnt = comm_layout_group(l, w->bw.rank, COMM_AXIS_PP, ranks);
    snprintf(name, sizeof(name), "pp.dp%d.tp%d", d, t);
    if (!(g->pp = comm_new(w, name, ranks, cnt, err, errlen))) goto fail;
    free(ranks);
    return 0;
fail:
    free(ranks);
    comm_groups_free(g);
    return -1;
}

void comm_groups_free(struct comm_groups *g) {
    comm_free(g->pp);
    comm_free(g->dp);
    comm_free(g->tp);
    comm_free(g->world);
    memset(g, 0, sizeof(*g));
}

/* ---- the local backend: a group of one on host memory */

static void *local_comm_init(const struct comm_backend_comm *c, char *err, size_t errlen) {
    if (c->size != 1) {
        snprintf(err, errlen, "local backend serves groups of one, not %d", c->size);
        return NULL;
    }
    static int token;
    return &token; /* no state; any non-NULL pointer */
}
static void local_comm_fini(void *impl) {
    (void)impl;
}
static int local_allreduce(void *impl, void *buf, size_t n, enum comm_dtype dt, enum comm_op op,
                           char *err, size_t errlen) {
    return 0;
}
static int local_reduce_scatter(void *impl, const void *send, void *recv, size_t total,
                                const size_t *counts, enum comm_dtype dt, enum comm_op op,
                                char *err, size_t errlen) {
    if (send != recv) memmove(recv, send, total * comm_dtype_size(dt));
    return 0;
}
static int local_all_gather(void *impl, const void *send, void *recv, size_t total,
                            const size_t *counts, enum comm_dtype dt, char *err, size_t errlen) {
    if (send != recv) memmove(recv, send, total * comm_dtype_size(dt));
    return 0;
}
static int local_broadcast(void *impl, void *buf, size_t n, enum comm_dtype dt, int root, char *err,
                           size_t errlen) {
    return 0;
}
static int local_barrier(void *impl, char *err, size_t errlen) {
    return 0;
}
static int local_p2p(void *impl, void *buf, size_t bytes, int peer, void **h, char *err,
                     size_t errlen) {
    snprintf(err, errlen, "no peers in a group of one");
    return -1;
}
static int local_isend(void *impl, const void *buf, size_t bytes, int peer, void **h, char *err,
                       size_t errlen) {
    return local_p2p(impl, NULL, bytes, peer, h, err, errlen);
}
static int local_p2p_wait(void *impl, void *h, char *err, size_t errlen) {
    return 0;
}

static const struct comm_backend_ops local_backend = {
    .name = "local",
    .comm_init = local_comm_init,
    .comm_fini = local_comm_fini,
    .allreduce = local_allreduce,
    .reduce_scatter = local_reduce_scatter,
    .all_gather = local_all_gather,
    .broadcast = local_broadcast,
    .barrier = local_barrier,
    .isend = local_isend,
    .irecv = local_p2p,
    .p2p_wait = local_p2p_wait,
};

static const struct comm_backend_ops *local_ops(void) {
    return &local_backend;
}

const struct comm_backend_ops *comm_backend_local(void) {
    return &local_backend;
}
