"""How many thread-block clusters of each size can be resident at once on this GPU (CUDA's occupancy
calculator for a kernel using the opt-in maximum of shared memory, as our GEMM CTAs do: ~217-227 KB).

Why: a grid of clusters larger than this runs in more than one wave.  H100/H200 SMs sit in GPCs of
different sizes, so ``132 / cluster size`` is an upper bound, not the figure (session 8: the cluster
split-K with 32 clusters of 4 ran 40% slower than 64 clusters of 2 doing the same work).
"""
import json
import sys

import cutlass.utils as utils
import torch


def main():
    torch.cuda.init()  # HardwareInfo's driver calls need an initialised context
    torch.zeros(1, device="cuda")
    hw = utils.HardwareInfo()
    res = {"gpu": torch.cuda.get_device_name(), "sm_count": hw.get_device_multiprocessor_count(),
           "max_active_clusters": {n: hw.get_max_active_clusters(n) for n in (1, 2, 4, 8, 16)}}
    print(json.dumps(res))
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
