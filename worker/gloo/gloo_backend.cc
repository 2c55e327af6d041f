/* The cpu comm backend: a thin C++ shim over Gloo (TCP transport) behind the
 * C backend interface of worker/comm/comm_backend.h.
 *
 * - Rendezvous: Gloo's full-mesh connect runs over a gloo Store that forwards
 *   to our C rendezvous (file: or loomd's HTTP endpoint), keys prefixed with
 *   the comm name, so one attempt holds many communicators.
 * - Algorithms and determinism: every algorithm used here reduces in an
 *   order fixed by (rank, size, count) alone and hands every rank the same
 *   bits, so the same layout gives the same bits run to run.
 *     allreduce:      gloo::allreduce, ring (reduce-scatter + all-gather of
 *                     segments; each segment is summed in ring order, then
 *                     copied, so all ranks hold identical results).
 *     all_gather:     gloo::allgatherv (pure copies; uneven shards).
 *     broadcast:      gloo::broadcast (copies), barrier: gloo::barrier.
 *     reduce_scatter: written here as a ring over Gloo's unbound buffers.
 *                     Gloo's new-style API has no reduce-scatter, and the
 *                     legacy ReduceScatterHalvingDoubling binds its buffers
 *                     at construction, takes int counts and has no timeout,
 *                     so it cannot serve per-call buffers of any size. Our
 *                     ring: shard j is summed starting at rank j+1 around the
 *                     ring and ends at rank j (fixed order, uneven shards).
 * - Failure: a peer that dies closes its sockets and pending operations
 *   throw at once; a peer that hangs trips the per-operation timeout; a peer
 *   that never arrives trips the rendezvous timeout. Every gloo exception is
 *   turned into -1 and a message; nothing escapes into C.
 * - bf16 sums are done in fp32 per element and rounded to nearest even. */
#include <netdb.h>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <unistd.h>

#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/types.h>

#include "worker/comm/comm_backend.h"

namespace {

/* Slot prefixes for what we build on unbound buffers; Gloo uses 0x01-0x08. */
constexpr uint8_t kReduceScatterSlot = 0x40;
constexpr uint8_t kP2PSlot = 0x41;

class RdzvStore : public gloo::rendezvous::Store {
  public:
    RdzvStore(struct rdzv *r, std::string prefix, int timeout_ms)
        : r_(r), prefix_(std::move(prefix)), timeout_ms_(timeout_ms) {}

    void set(const std::string &key, const std::vector<char> &data) override {
        char err[512] = "";
        if (rdzv_set(r_, (prefix_ + key).c_str(), data.data(), data.size(), err, sizeof(err)))
            throw gloo::IoException(err);
    }

    std::vector<char> get(const std::string &key) override {
        return fetch(key, timeout_ms_);
    }

    void wait(const std::vector<std::string> &keys) override {
        wait(keys, std::chrono::milliseconds(timeout_ms_));
    }

    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override {
        auto deadline = std::chrono::steady_clock::now() + timeout;
        for (const auto &k : keys) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
            fetch(k, left > 0 ? (int)left : 1);
        }
    }

  private:
    std::vector<char> fetch(const std::string &key, int timeout_ms) {
        void *val = nullptr;
        size_t len = 0;
        char err[512] = "";
        int rc = rdzv_get(r_, (prefix_ + key).c_str(), &val, &len, timeout_ms, err, sizeof(err));
        if (rc != 0) {
            std::string m = err;
            if (rc == -2) m += " (a peer rank never arrived: is every rank started?)";
            throw gloo::IoException(m);
        }
        std::vector<char> out((char *)val, (char *)val + len);
        free(val);
        return out;
    }

    struct rdzv *r_;
    std::string prefix_;
    int timeout_ms_;
};

struct World {
    std::shared_ptr<gloo::transport::Device> dev;
    const struct comm_backend_world *w;
};

struct Comm {
    std::shared_ptr<gloo::rendezvous::Context> ctx;
    int rank, size;
    std::chrono::milliseconds timeout;
    uint32_t tag = 0;
    std::vector<char> scratch; /* reduce-scatter ring buffers */
};

struct P2P {
    std::unique_ptr<gloo::transport::UnboundBuffer> buf;
    bool send;
};

template <typename F> int guarded(char *err, size_t errlen, F &&f) {
    try {
        f();
        return 0;
    } catch (const std::exception &e) {
        snprintf(err, errlen, "%s", e.what());
    } catch (...) {
        snprintf(err, errlen, "unknown gloo error");
    }
    return -1;
}

/* ---- element-wise reductions: out[i] = a[i] op b[i] */

float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* NaN stays NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

void bf16_reduce(void *c_, const void *a_, const void *b_, size_t n, enum comm_op op) {
    uint16_t *c = (uint16_t *)c_;
    const uint16_t *a = (const uint16_t *)a_, *b = (const uint16_t *)b_;
    for (size_t i = 0; i < n; i++) {
        float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
        float r = op == COMM_SUM ? x + y : op == COMM_MAX ? (x > y ? x : y) : (x < y ? x : y);
        c[i] = f32_to_bf16(r);
    }
}

template <typename T> gloo::AllreduceOptions::Func typed_fn(enum comm_op op) {
    using Fn = void (*)(void *, const void *, const void *, size_t);
    Fn s = &gloo::sum<T>, mx = &gloo::max<T>, mn = &gloo::min<T>;
    return op == COMM_SUM ? s : op == COMM_MAX ? mx : mn;
}

/* The reduction for (dt, op); an empty function for unsupported types. */
gloo::AllreduceOptions::Func reduce_fn(enum comm_dtype dt, enum comm_op op) {
    switch (dt) {
    case COMM_F32:
        return typed_fn<float>(op);
    case COMM_F64:
        return typed_fn<double>(op);
    case COMM_I32:
        return typed_fn<int32_t>(op);
    case COMM_I64:
        return typed_fn<int64_t>(op);
    case COMM_U8:
        return typed_fn<uint8_t>(op);
    case COMM_F16:
        return typed_fn<gloo::float16>(op);
    case COMM_BF16:
        return
            [op](void *c, const void *a, const void *b, size_t n) { bf16_reduce(c, a, b, n, op); };
    }
    return nullptr;
}

/* ---- world and comm set-up */

static bool host_resolves(const char *name) {
    struct addrinfo hints, *res = nullptr;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(name, nullptr, &hints, &res) != 0) return false;
    freeaddrinfo(res);
    return true;
}

void *world_init(const struct comm_backend_world *w, char *err, size_t errlen) {
    World *gw = nullptr;
    int rc = guarded(err, errlen, [&] {
        gloo::transport::tcp::attr attr;
        /* Where this rank listens: the comm-iface row (LOOM_COMM_IFACE, a
         * network interface), comm-host (LOOM_COMM_HOST, an address or name),
         * else loopback when the rendezvous is a shared directory (one host),
         * else this host's name. */
        const char *iface = w->iface;
        const char *host = w->host;
        char hn[256] = "127.0.0.1";
        if (iface && *iface) {
            attr.iface = iface;
        } else if (host && *host) {
            attr.hostname = host;
        } else {
            if (!w->rdzv_is_file && gethostname(hn, sizeof(hn)) != 0) strcpy(hn, "127.0.0.1");
            /* A host name that does not resolve (a fresh VM or container
             * without an /etc/hosts entry) would make Gloo fail; fall back to
             * loopback, which serves every rank on this host. Multi-node cpu
             * runs set LOOM_COMM_IFACE or LOOM_COMM_HOST. */
            if (!host_resolves(hn)) {
                fprintf(stderr,
                        "comm: host name '%s' does not resolve; listening on 127.0.0.1 "
                        "(set LOOM_COMM_HOST or LOOM_COMM_IFACE for multi-node runs)\n",
                        hn);
                strcpy(hn, "127.0.0.1");
            }
            attr.hostname = hn;
        }
        gw = new World;
        gw->w = w;
        gw->dev = gloo::transport::tcp::CreateDevice(attr);
    });
    if (rc != 0) {
        delete gw;
        return nullptr;
    }
    return gw;
}

void world_fini(void *impl) {
    delete static_cast<World *>(impl);
}

void *comm_init(const struct comm_backend_comm *c, char *err, size_t errlen) {
    World *gw = static_cast<World *>(c->world_impl);
    Comm *gc = new Comm;
    gc->rank = c->rank;
    gc->size = c->size;
    gc->timeout = std::chrono::milliseconds(c->world->timeout_ms);
    int rc = guarded(err, errlen, [&] {
        RdzvStore store(c->world->rdzv, std::string("gloo/") + c->name + "/", c->world->timeout_ms);
        gc->ctx = std::make_shared<gloo::rendezvous::Context>(c->rank, c->size);
        gc->ctx->setTimeout(gc->timeout);
        gc->ctx->connectFullMesh(store, gw->dev);
    });
    if (rc != 0) {
        delete gc;
        return nullptr;
    }
    return gc;
}

void comm_fini(void *impl) {
    delete static_cast<Comm *>(impl);
}

/* ---- collectives */

/* Gloo's option setters are templated on the element type only for its
 * size; pick an unsigned type of the element's width. */
template <typename Opts> void set_output(Opts &o, void *buf, size_t n, size_t es) {
    switch (es) {
    case 1:
        o.template setOutput<uint8_t>((uint8_t *)buf, n);
        break;
    case 2:
        o.template setOutput<uint16_t>((uint16_t *)buf, n);
        break;
    case 4:
        o.template setOutput<uint32_t>((uint32_t *)buf, n);
        break;
    default:
        o.template setOutput<uint64_t>((uint64_t *)buf, n);
        break;
    }
}

int allreduce(void *impl, void *buf, size_t n, enum comm_dtype dt, enum comm_op op, char *err,
              size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    auto fn = reduce_fn(dt, op);
    if (!fn) {
        snprintf(err, errlen, "unsupported type");
        return -1;
    }
    return guarded(err, errlen, [&] {
        gloo::AllreduceOptions o(gc->ctx);
        o.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
        set_output(o, buf, n, comm_dtype_size(dt));
        o.setReduceFunction(fn);
        o.setTag(gc->tag++);
        o.setTimeout(gc->timeout);
        gloo::allreduce(o);
    });
}

int all_gather(void *impl, const void *send, void *recv, size_t total, const size_t *cnts,
               enum comm_dtype dt, char *err, size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    size_t es = comm_dtype_size(dt);
    return guarded(err, errlen, [&] {
        std::vector<size_t> counts(cnts, cnts + gc->size);
        size_t off = 0, cnt = counts[gc->rank];
        for (int i = 0; i < gc->rank; i++)
            off += counts[i];
        char *mine = (char *)recv + off * es;
        if (send != mine && cnt) memmove(mine, send, cnt * es);
        /* Output only: allgatherv then takes this rank's slice in place. */
        gloo::AllgathervOptions o(gc->ctx);
        switch (es) {
        case 1:
            o.setOutput<uint8_t>((uint8_t *)recv, counts);
            break;
        case 2:
            o.setOutput<uint16_t>((uint16_t *)recv, counts);
            break;
        case 4:
            o.setOutput<uint32_t>((uint32_t *)recv, counts);
            break;
        default:
            o.setOutput<uint64_t>((uint64_t *)recv, counts);
            break;
        }
        o.setTag(gc->tag++);
        o.setTimeout(gc->timeout);
        gloo::allgatherv(o);
    });
}

int broadcast(void *impl, void *buf, size_t n, enum comm_dtype dt, int root, char *err,
              size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    return guarded(err, errlen, [&] {
        gloo::BroadcastOptions o(gc->ctx);
        set_output(o, buf, n, comm_dtype_size(dt));
        o.setRoot(root);
        o.setTag(gc->tag++);
        o.setTimeout(gc->timeout);
        gloo::broadcast(o);
    });
}

int barrier(void *impl, char *err, size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    return guarded(err, errlen, [&] {
        gloo::BarrierOptions o(gc->ctx);
        o.setTag(gc->tag++);
        o.setTimeout(gc->timeout);
        gloo::barrier(o);
    });
}

/* Ring reduce-scatter over unbound buffers (why by hand: see the top
 * comment). Step k (1..P-1): receive from the left the partial sum of shard
 * (r-1-k) mod P, add this rank's own part of that shard, pass it on to the
 * right; after P-1 steps the partial is shard r, complete. The sum of shard j
 * is ((x_{j+1} + x_{j+2}) + ...) + x_j, the same on every run. */
int reduce_scatter(void *impl, const void *send, void *recv, size_t total, const size_t *counts,
                   enum comm_dtype dt, enum comm_op op, char *err, size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    auto fn = reduce_fn(dt, op);
    if (!fn) {
        snprintf(err, errlen, "unsupported type");
        return -1;
    }
    const int P = gc->size, r = gc->rank;
    const size_t es = comm_dtype_size(dt);
    const char *in = (const char *)send;
    return guarded(err, errlen, [&] {
        std::vector<size_t> off(P), cnt(counts, counts + P);
        size_t maxcnt = 0, o = 0;
        for (int i = 0; i < P; i++) {
            off[i] = o;
            o += cnt[i];
            if (cnt[i] > maxcnt) maxcnt = cnt[i];
        }
        if (gc->scratch.size() < 2 * maxcnt * es) gc->scratch.resize(2 * maxcnt * es);
        char *a = gc->scratch.data(), *b = a + maxcnt * es;
        auto ua = gc->ctx->createUnboundBuffer(a, maxcnt * es);
        auto ub = gc->ctx->createUnboundBuffer(b, maxcnt * es);
        const int right = (r + 1) % P, left = (r - 1 + P) % P;
        const uint32_t tag = gc->tag++;
        int seg = (r - 1 + P) % P; /* shard held in a */
        if (cnt[seg]) memcpy(a, in + off[seg] * es, cnt[seg] * es);
        for (int k = 1; k < P; k++) {
            const int rseg = ((r - 1 - k) % P + P) % P;
            auto slot = gloo::Slot::build(kReduceScatterSlot, tag) + (uint8_t)(k & 0xff);
            if (cnt[rseg]) ub->recv(left, slot, 0, cnt[rseg] * es);
            if (cnt[seg]) ua->send(right, slot, 0, cnt[seg] * es);
            if (cnt[seg]) ua->waitSend(gc->timeout);
            if (cnt[rseg]) ub->waitRecv(gc->timeout);
            if (cnt[rseg]) fn(b, b, in + off[rseg] * es, cnt[rseg]);
            std::swap(a, b);
            std::swap(ua, ub);
            seg = rseg;
        }
        if (cnt[r]) memcpy(recv, a, cnt[r] * es);
    });
}

/* ---- point-to-point: unbound buffers on one slot, so messages between a
 * pair match in posting order (TCP keeps them in order). */

int isend(void *impl, const void *buf, size_t bytes, int peer, void **h, char *err, size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    return guarded(err, errlen, [&] {
        auto p = std::make_unique<P2P>();
        p->buf = gc->ctx->createUnboundBuffer(const_cast<void *>(buf), bytes);
        p->send = true;
        p->buf->send(peer, gloo::Slot::build(kP2PSlot, 0));
        *h = p.release();
    });
}

int irecv(void *impl, void *buf, size_t bytes, int peer, void **h, char *err, size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    return guarded(err, errlen, [&] {
        auto p = std::make_unique<P2P>();
        p->buf = gc->ctx->createUnboundBuffer(buf, bytes);
        p->send = false;
        p->buf->recv(peer, gloo::Slot::build(kP2PSlot, 0));
        *h = p.release();
    });
}

int p2p_wait(void *impl, void *h, char *err, size_t errlen) {
    Comm *gc = static_cast<Comm *>(impl);
    std::unique_ptr<P2P> p(static_cast<P2P *>(h));
    return guarded(err, errlen, [&] {
        if (p->send)
            p->buf->waitSend(gc->timeout);
        else
            p->buf->waitRecv(gc->timeout);
    });
}

const struct comm_backend_ops gloo_ops =
    {
        "gloo",    world_init,     world_fini, comm_init, comm_fini,
        allreduce, reduce_scatter, all_gather, broadcast, barrier,
        isend,     irecv,          p2p_wait,   nullptr, /* sendrecv: posting both unbound buffers
                                                           cannot cross-wait */
        nullptr, /* allreduce_stream: no device streams on the cpu backend */
};

} // namespace

extern "C" const struct comm_backend_ops *comm_backend_gloo(void) {
    return &gloo_ops;
}
