"""The harness around the kernels: `reference` (the fp32 oracle), `batch` (`PagedBatch`),
`implementations` (ours and the comparators), `spec` + `microbench` (YAML sweeps to CSV),
`tune` (config sweeps to a fitted tree), `aot` (cross-compiles for GPU targets), `cli`."""
