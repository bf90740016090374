"""Decision tree tuned by `attnbench tune` on NVIDIA H100 80GB HBM3.

Source measurements: docs/perf/h100/tune-2026-11-24-page-copies.csv. Regenerate rather than edit by hand.

Per case of the sweep (its median times):

* decode-b1-ctx1k: fastest 13.2 us; the tree's pick 13.2 us (+0.0%): {'num_segments': 32, 'variant': 'parallel_tiled'}
* decode-b8-ctx1k: fastest 27.9 us; the tree's pick 27.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* decode-b32-ctx4k: fastest 193.9 us; the tree's pick 198.2 us (+2.2%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* decode-b64-ctx4k: fastest 372.2 us; the tree's pick 375.9 us (+1.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* decode-b128-ctx4k: fastest 724.9 us; the tree's pick 727.4 us (+0.3%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* decode-b256-ctx1k: fastest 377.8 us; the tree's pick 377.8 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b1-ctx16k: fastest 43.3 us; the tree's pick 43.3 us (+0.0%): {'num_segments': 32, 'tile_size': 128, 'variant': 'parallel_tiled'}
* decode-b4-ctx16k: fastest 111.6 us; the tree's pick 112.8 us (+1.1%): {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
* decode-b16-ctx512: fastest 24.8 us; the tree's pick 24.8 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* decode-b64-ctx512: fastest 65.3 us; the tree's pick 65.3 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b64-ctx2k: fastest 196.2 us; the tree's pick 198.9 us (+1.4%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* decode-b16-ctx8k: fastest 195.9 us; the tree's pick 195.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* mqa-decode-b16-ctx4k: fastest 30.6 us; the tree's pick 31.0 us (+1.4%): {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
* serve-mixed-b16-ctx256: fastest 22.3 us; the tree's pick 22.3 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 64, 'variant': 'qblock'}
* serve-mixed-b48-ctx512: fastest 59.6 us; the tree's pick 59.6 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* serve-mixed-b128-ctx1k: fastest 210.8 us; the tree's pick 210.8 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* serve-chunk-b64-ctx2k: fastest 617.0 us; the tree's pick 617.0 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* mixed-2k: fastest 294.3 us; the tree's pick 296.2 us (+0.6%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-512: fastest 20.9 us; the tree's pick 21.1 us (+0.9%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b1-2k: fastest 91.6 us; the tree's pick 91.6 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b16-512: fastest 177.3 us; the tree's pick 177.3 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b4-384: fastest 38.4 us; the tree's pick 38.4 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b1-1k: fastest 36.1 us; the tree's pick 36.7 us (+1.8%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* mixed-b8-512: fastest 41.0 us; the tree's pick 41.0 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* mixed-b32-512: fastest 109.5 us; the tree's pick 115.6 us (+5.6%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b4-2k: fastest 335.3 us; the tree's pick 335.3 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-8k: fastest 1027.7 us; the tree's pick 1027.7 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* chunk-b2-2k-ctx6k: fastest 903.6 us; the tree's pick 921.0 us (+1.9%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
"""

from attnbench.kernels.bench.tune import features


def choose(shape, platform) -> dict:
    f = features(shape)
    if f['decode_only'] <= 0.5:
        if f['avg_seqlen_q'] <= 24.2462:
            if f['max_seqlen_k'] <= 384:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 64, 'variant': 'qblock'}
            else:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
        else:
            if f['max_seqlen_k'] <= 768:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
            else:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
    else:
        if f['kv_programs'] <= 48:
            if f['max_seqlen_k'] <= 2560:
                return {'num_segments': 32, 'variant': 'parallel_tiled'}
            else:
                if f['kv_programs'] <= 12:
                    return {'num_segments': 32, 'tile_size': 128, 'variant': 'parallel_tiled'}
                else:
                    return {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
        else:
            if f['max_seqlen_k'] <= 1536:
                if f['kv_programs'] <= 96:
                    return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
                else:
                    if f['kv_programs'] <= 320:
                        return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
                    else:
                        return {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
            else:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
