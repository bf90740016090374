"""The paper's kernel steps, one module each (`naive`, `qblock`, `parallel_tiled`,
`static_grid`), built from the shared Triton blocks of `blocks`. Each module declares its
launcher and default-config tree as ``STEP``; `attnbench.kernels.variants` lists them."""
