/* Backend helpers shared by every backend implementation. */
#include <stdlib.h>

#include "worker/backend.h"
#include "worker/tuning.h"

void backend_free(struct backend *b) {
    if (!b) return;
    if (b->destroy) b->destroy(b->ctx);
    free(b);
}

#ifdef LOOM_HAVE_CUDA
/* Here rather than in worker/cuda/ because the tuning rows live in the
 * engine library (worker/tuning.c), which links the CUDA one. */
struct backend *backend_cuda_new(int device) {
    struct worker_tuning t;
    if (worker_tuning_from_env(&t) != 0) {
        worker_tuning_free(&t);
        return NULL;
    }
    struct backend *b = backend_cuda_new_tuned(device, &t.cuda);
    worker_tuning_free(&t);
    return b;
}
#endif
