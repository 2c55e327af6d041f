#!/bin/bash
# Third session: why dp2 did not speed up with the faster 1-GPU step (exposed
# comm 0.4 -> 1.6 ms at 11:55): GPT-2 124M dp2 A/B of the norm variant, the
# DGELU fusion, the pair streams' priority and NCCL, with a timeline trace.
. "$(dirname "$0")/call_env.sh"
echo "1gpu norm3: $(LOOM_NORM_VARIANT=3 b 1)"
echo "dp2 old (no dgelu, norm0): $(LOOM_FUSE_DGELU=0 LOOM_NORM_VARIANT=0 b 2)"
echo "dp2 norm3: $(LOOM_NORM_VARIANT=3 b 2)"
echo "dp2 norm3 no dgelu: $(LOOM_NORM_VARIANT=3 LOOM_FUSE_DGELU=0 b 2)"
echo "dp2 norm0 dgelu: $(LOOM_NORM_VARIANT=0 b 2)"
echo "dp2 norm3 prio: $(LOOM_NORM_VARIANT=3 LOOM_PAIR_PRIORITY=high b 2)"
echo "dp2 norm3 nccl: $(LOOM_NORM_VARIANT=3 LOOM_DP_PAIR=0 b 2)"
el
echo "dp2 norm3 trace: $(LOOM_NORM_VARIANT=3 LOOM_PAIR_TRACE=12 b 2)"
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | grep "rank 0" | awk 'NR%3==1 || /chunk 3[0-9]/'
grep -h "pair trace" "$OUT"/dist/bench*2_z0*.err | grep "rank 1" | tail -4
grep -h '"type":"step"' "$OUT"/dist/bench_124m_2_z0.out | tail -2 | cut -c1-330
echo "1gpu norm3: $(LOOM_NORM_VARIANT=3 b 1)"
el
