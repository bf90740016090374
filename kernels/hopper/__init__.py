"""Kernels written for one GPU generation in Gluon (Triton's lower-level dialect), where
Triton's own compiler does not give a step the schedule the hardware needs: `qblock_wgmma`
is the Q-block step for Hopper (sm_90). Not steps of the paper: the microbenchmark times
them beside the steps (`bench/implementations.py`)."""
