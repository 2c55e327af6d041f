# All-reduce bus bandwidth through torch.distributed (NCCL), the peer of
# tests/gpu/bench_nccl_allreduce.c: same sizes, in-place f32 sum, two warm-up
# calls, median of `iters` timed calls each followed by cuda synchronize (a
# blocking call, like the engine's), busbw = bytes/t * 2(n-1)/n.
# Usage: python3 -m torch.distributed.run --nproc_per_node=2 torch_allreduce.py [max_mb] [iters]
import json, os, sys, time
import torch
import torch.distributed as dist

def main():
    max_mb = float(sys.argv[1]) if len(sys.argv) > 1 else 1024
    iters = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    local = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = dist.get_rank(), dist.get_world_size()
    mb = 1.0
    while mb <= max_mb * 1.0001:
        n = int(mb * 1048576) // 4
        x = torch.full((n,), float(rank + 1), device="cuda", dtype=torch.float32)
        dist.all_reduce(x)
        torch.cuda.synchronize()
        want = world * (world + 1) / 2
        assert x[0].item() == want and x[-1].item() == want, (x[0].item(), want)
        dist.all_reduce(x)
        ts = []
        for _ in range(iters):
            dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dist.all_reduce(x)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        ts.sort()
        med = ts[len(ts) // 2]
        alg = n * 4 / med / 1e9
        if rank == 0:
            print(json.dumps({"impl": "torch", "ranks": world, "mib": mb, "us": round(med * 1e6, 1),
                              "algbw_gbs": round(alg, 2),
                              "busbw_gbs": round(alg * 2 * (world - 1) / world, 2)}), flush=True)
        mb *= 2
    dist.destroy_process_group()

if __name__ == "__main__":
    main()
