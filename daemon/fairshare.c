/* Fair-share usage decay (fairshare.h). Only libc and libm. */
#include "daemon/fairshare.h"

#include <math.h>

double fairshare_weight(int64_t age_ms, long half_life_s) {
    if (half_life_s <= 0) return 0.0;
    if (age_ms <= 0) return 1.0;
    return exp2(-(double)age_ms / ((double)half_life_s * 1000.0));
}

double fairshare_usage(const struct fairshare_row *rows, int n, int64_t now_ms, long half_life_s) {
    double sum = 0.0;
    for (int i = 0; i < n; i++)
        sum += rows[i].gpu_hours * fairshare_weight(now_ms - rows[i].at_ms, half_life_s);
    return sum;
}
