"""Choosing and running a step: `heuristics` (the config for a batch and platform: the
`auto` dispatch over the steps' own trees), its rules for short queries (`split_kv`,
`short_queries`, over `grid`'s programs), the fitted trees (`trees`), and `api`
(`paged_attention`, `precompile`)."""
