"""Choosing and running a step: `heuristics` (the config for a batch and platform: the
steps' trees, the `auto` dispatch, tuned trees) and `api` (`paged_attention`, `precompile`)."""
