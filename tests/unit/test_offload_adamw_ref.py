#!/usr/bin/env python3
"""The offloaded optimizer's CPU AdamW against torch.optim.AdamW's formula
(decoupled weight decay applied first, then the bias-corrected step), written
here in numpy float64, each step from the kernel's float32 state before it and
with the float32 bias corrections the engine hands the kernel: `test_offload_adamw --dump FILE` runs 4 steps of 4096
fp32 elements with the fastest kernel of the CPU; every step's master, m and
v must agree with the reference to 4 float32 ulps of the operands' magnitude.
Usage: test_offload_adamw_ref.py BIN/test_offload_adamw"""
import os, subprocess, sys, tempfile

import numpy as np


EPS32 = 2.0 ** -23


def err_ulps(got, ref, scale):
    """|got - ref| in float32 ulps of the operands' magnitude (scale): the
    error measure of a float32 evaluation of a float64 formula, which stays
    meaningful where the result itself is near zero (cancellation)"""
    return np.max(np.abs(got.astype(np.float64) - ref) / (np.maximum(scale, 1e-30) * EPS32))


def main():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "case.bin")
        subprocess.run([sys.argv[1], "--dump", path], check=True)
        raw = open(path, "rb").read()
    n, steps = np.frombuffer(raw, np.int64, 2)
    n, steps = int(n), int(steps)
    lr, b1, b2, eps, wd, gs = (float(x) for x in np.frombuffer(raw, np.float32, 6, 16))
    bcs = np.frombuffer(raw, np.float32, 2 * steps, 40).astype(np.float64).reshape(steps, 2)
    arrs = np.frombuffer(raw, np.float32, offset=40 + 8 * steps).reshape(-1, n)
    worst = {"master": 0.0, "m": 0.0, "v": 0.0}
    fails = 0
    for s in range(1, steps + 1):
        # each step from the kernel's own float32 state before it
        prev = 0 if s == 1 else 3 + (s - 2) * 4 + 1
        p, m, v = (arrs[prev + i].astype(np.float64) for i in range(3))
        base = 3 + (s - 1) * 4
        g = arrs[base].astype(np.float64) * gs
        # torch.optim.AdamW (foreach=False, amsgrad=False, maximize=False)
        p_dec = p * (1 - lr * wd)
        m_new = b1 * m + (1 - b1) * g
        v_new = b2 * v + (1 - b2) * g * g
        # torch: bc1 = 1 - b1 ** s, bc2 = 1 - b2 ** s in float64; the engine hands the kernel
        # these in float32 (1 - powf(b, s), as the GPU kernel), which is what it is tested on
        bc1, bc2 = bcs[s - 1]
        step = (lr / bc1) * m_new / (np.sqrt(v_new) / np.sqrt(bc2) + eps)
        p_new = p_dec - step
        rows = (("master", arrs[base + 1], p_new, np.abs(p) + np.abs(step) + lr * wd * np.abs(p)),
                ("m", arrs[base + 2], m_new, np.abs(b1 * m) + np.abs((1 - b1) * g)),
                ("v", arrs[base + 3], v_new, np.abs(b2 * v) + np.abs((1 - b2) * g * g)))
        for name, got, ref, scale in rows:
            u = float(err_ulps(got, ref, scale))
            worst[name] = max(worst[name], round(u, 2))
            if u > 4:
                fails += 1
                print("FAIL step %d %s: %.1f ulps from the reference (tolerance 4)" % (s, name, u))
    print("%s AdamW vs the torch formula over %d steps of %d elements: max ulps %s" % (
        "FAIL" if fails else "PASS", steps, n, worst))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
