"""Decision tree tuned by `attnbench tune` on NVIDIA H100 80GB HBM3.

Source measurements: docs/perf/h100/tune-2026-11-24-serving-short.csv. Regenerate rather than edit by hand.

Per case of the sweep (its median times):

* decode-b1-ctx1k: fastest 13.3 us; the tree's pick 13.3 us (+0.0%): {'num_segments': 16, 'tile_size': 64, 'variant': 'parallel_tiled'}
* decode-b8-ctx1k: fastest 28.1 us; the tree's pick 28.1 us (+0.0%): {'num_segments': 16, 'variant': 'parallel_tiled'}
* decode-b32-ctx4k: fastest 194.2 us; the tree's pick 194.2 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b64-ctx4k: fastest 372.3 us; the tree's pick 372.3 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b128-ctx4k: fastest 725.1 us; the tree's pick 725.1 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b256-ctx1k: fastest 377.2 us; the tree's pick 377.2 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b1-ctx16k: fastest 43.2 us; the tree's pick 43.2 us (+0.0%): {'num_segments': 32, 'tile_size': 128, 'variant': 'parallel_tiled'}
* decode-b4-ctx16k: fastest 111.6 us; the tree's pick 113.0 us (+1.2%): {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
* mqa-decode-b16-ctx4k: fastest 30.6 us; the tree's pick 30.8 us (+0.7%): {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
* serve-mixed-b16-ctx256: fastest 22.8 us; the tree's pick 22.8 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 64, 'variant': 'qblock'}
* serve-mixed-b48-ctx512: fastest 59.8 us; the tree's pick 59.8 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* serve-mixed-b128-ctx1k: fastest 212.8 us; the tree's pick 212.8 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* serve-chunk-b64-ctx2k: fastest 638.8 us; the tree's pick 651.2 us (+1.9%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* mixed-2k: fastest 307.9 us; the tree's pick 307.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-512: fastest 20.9 us; the tree's pick 20.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b1-2k: fastest 92.8 us; the tree's pick 92.8 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b16-512: fastest 177.4 us; the tree's pick 177.4 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b4-384: fastest 39.0 us; the tree's pick 39.0 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b1-1k: fastest 35.9 us; the tree's pick 35.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 64, 'variant': 'qblock'}
* mixed-b8-512: fastest 41.2 us; the tree's pick 41.2 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* mixed-b32-512: fastest 109.3 us; the tree's pick 116.6 us (+6.7%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
* prefill-b4-2k: fastest 347.9 us; the tree's pick 347.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-8k: fastest 1080.9 us; the tree's pick 1080.9 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* chunk-b2-2k-ctx6k: fastest 947.7 us; the tree's pick 947.7 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
"""

from attnbench.kernels.bench.tune import features


def choose(shape, platform) -> dict:
    f = features(shape)
    if f['decode_only'] <= 0.5:
        if f['avg_seqlen_q'] <= 24.2462:
            if f['max_seqlen_k'] <= 384:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 64, 'variant': 'qblock'}
            else:
                return {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
        else:
            if f['max_seqlen_k'] <= 768:
                return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'tile_size': 64, 'variant': 'qblock'}
            else:
                if f['max_seqlen_k'] <= 1536:
                    return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 64, 'variant': 'qblock'}
                else:
                    return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
    else:
        if f['kv_programs'] <= 48:
            if f['max_seqlen_k'] <= 2560:
                return {'num_segments': 16, 'tile_size': 64, 'variant': 'parallel_tiled'}
            else:
                if f['num_seqs'] <= 2.5:
                    return {'num_segments': 32, 'tile_size': 128, 'variant': 'parallel_tiled'}
                else:
                    return {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
        else:
            if f['num_seqs'] <= 192:
                if f['max_seqlen_k'] <= 2560:
                    return {'num_segments': 16, 'variant': 'parallel_tiled'}
                else:
                    return {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
            else:
                return {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
