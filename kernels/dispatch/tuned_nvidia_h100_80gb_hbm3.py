"""Decision tree tuned by `attnbench tune` on NVIDIA H100 80GB HBM3.

Source measurements: docs/perf/h100/tune-2026-11-25-reduce1.csv. Regenerate rather than edit by hand.

Per case of the sweep (its median times):

* decode-b1-ctx1k: fastest 12.6 us; the tree's pick 12.6 us (+0.0%): {'variant': 'parallel_tiled', 'num_segments': 32}
* decode-b8-ctx1k: fastest 28.0 us; the tree's pick 28.4 us (+1.6%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b32-ctx4k: fastest 194.0 us; the tree's pick 197.6 us (+1.9%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b64-ctx4k: fastest 372.4 us; the tree's pick 375.4 us (+0.8%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b128-ctx4k: fastest 725.3 us; the tree's pick 727.6 us (+0.3%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b256-ctx1k: fastest 378.4 us; the tree's pick 380.5 us (+0.6%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b1-ctx16k: fastest 42.2 us; the tree's pick 42.2 us (+0.0%): {'variant': 'parallel_tiled', 'tile_size': 128, 'num_segments': 32}
* decode-b4-ctx16k: fastest 110.7 us; the tree's pick 112.1 us (+1.2%): {'variant': 'parallel_tiled', 'tile_size': 128, 'num_segments': 16}
* decode-b16-ctx512: fastest 25.4 us; the tree's pick 26.4 us (+3.9%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b64-ctx512: fastest 65.4 us; the tree's pick 65.9 us (+0.8%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b64-ctx2k: fastest 195.7 us; the tree's pick 199.8 us (+2.1%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* decode-b16-ctx8k: fastest 196.1 us; the tree's pick 196.1 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* mqa-decode-b16-ctx4k: fastest 29.4 us; the tree's pick 29.8 us (+1.3%): {'variant': 'parallel_tiled', 'tile_size': 128, 'num_segments': 16}
* serve-mixed-b16-ctx256: fastest 21.6 us; the tree's pick 21.6 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* serve-mixed-b48-ctx512: fastest 59.5 us; the tree's pick 60.2 us (+1.1%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* serve-mixed-b128-ctx1k: fastest 208.9 us; the tree's pick 208.9 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* serve-chunk-b64-ctx2k: fastest 600.3 us; the tree's pick 600.3 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* mixed-2k: fastest 275.5 us; the tree's pick 278.3 us (+1.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* prefill-b1-512: fastest 19.3 us; the tree's pick 19.3 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12}
* prefill-b1-2k: fastest 83.2 us; the tree's pick 83.2 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* prefill-b16-512: fastest 156.2 us; the tree's pick 156.2 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 64, 'block_m': 128, 'num_warps': 12}
* prefill-b4-384: fastest 34.1 us; the tree's pick 34.1 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 64, 'block_m': 128, 'num_warps': 12}
* prefill-b1-1k: fastest 32.8 us; the tree's pick 33.2 us (+1.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* mixed-b8-512: fastest 35.8 us; the tree's pick 35.8 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 64, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* mixed-b32-512: fastest 98.1 us; the tree's pick 98.1 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 64, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* prefill-b4-2k: fastest 310.3 us; the tree's pick 310.3 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* prefill-b1-8k: fastest 1003.4 us; the tree's pick 1003.4 us (+0.0%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
* chunk-b2-2k-ctx6k: fastest 836.0 us; the tree's pick 846.8 us (+1.3%): {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
"""

from attnbench.kernels.dispatch.features import features


def choose(shape, platform) -> dict:
    f = features(shape)
    if f['decode_only'] <= 0.5:
        if f['avg_seqlen_q'] <= 24.2462:
            return {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
        else:
            if f['max_seqlen_k'] <= 768:
                if f['kv_programs'] <= 20:
                    return {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12}
                else:
                    if f['avg_seqlen_q'] <= 288.25:
                        return {'variant': 'qblock_ws', 'tile_size': 64, 'block_m': 128, 'num_warps': 12, 'persistent': True}
                    else:
                        return {'variant': 'qblock_ws', 'tile_size': 64, 'block_m': 128, 'num_warps': 12}
            else:
                return {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
    else:
        if f['kv_programs'] <= 48:
            if f['max_seqlen_k'] <= 2560:
                return {'variant': 'parallel_tiled', 'num_segments': 32}
            else:
                if f['kv_programs'] <= 12:
                    return {'variant': 'parallel_tiled', 'tile_size': 128, 'num_segments': 32}
                else:
                    return {'variant': 'parallel_tiled', 'tile_size': 128, 'num_segments': 16}
        else:
            return {'variant': 'qblock_ws', 'tile_size': 128, 'block_m': 128, 'num_warps': 12, 'persistent': True}
