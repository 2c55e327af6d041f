/* Backend helpers shared by every backend implementation. */
#include <stdlib.h>

#include "worker/backend.h"

void backend_free(struct backend *b) {
    if (!b) return;
    if (b->destroy) b->destroy(b->ctx);
    free(b);
}
