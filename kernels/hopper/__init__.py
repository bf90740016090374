"""Kernels written for one GPU generation in Gluon (Triton's lower-level dialect), where
Triton's own compiler does not give a step the schedule the hardware needs: the Q-block
step for Hopper (sm_90) as `qblock_wgmma` (the softmax overlapped with the tensor cores)
and `qblock_ws` (the same with a warp-specialized producer), on the Gluon blocks of
`blocks` and the launch of `host`. Not steps of the paper: `qblock_ws` is a registered
kernel of its own (`kernels/variants.py`), which `auto` runs on Hopper for every batch the
2D grid fills (`dispatch/heuristics.py`); the microbenchmark times both, and the launch
options of `qblock_ws` one by one (`bench/implementations.py`)."""
