"""Decision tree tuned by `attnbench tune` on NVIDIA H100 80GB HBM3.

Source measurements: docs/perf/h100/tune-2026-11-24-serving.csv. Regenerate rather than edit by hand.

Per case of the sweep (its median times):

* decode-b1-ctx1k: fastest 13.3 us; the tree's pick 13.3 us (+0.0%): {'num_segments': 32, 'variant': 'parallel_tiled'}
* decode-b8-ctx1k: fastest 28.0 us; the tree's pick 28.0 us (+0.0%): {'num_segments': 16, 'variant': 'parallel_tiled'}
* decode-b32-ctx4k: fastest 194.3 us; the tree's pick 194.3 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b64-ctx4k: fastest 372.9 us; the tree's pick 372.9 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b128-ctx4k: fastest 724.8 us; the tree's pick 724.8 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b256-ctx1k: fastest 377.6 us; the tree's pick 377.6 us (+0.0%): {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
* decode-b1-ctx16k: fastest 43.3 us; the tree's pick 43.3 us (+0.0%): {'num_segments': 32, 'tile_size': 64, 'variant': 'parallel_tiled'}
* decode-b4-ctx16k: fastest 110.9 us; the tree's pick 112.2 us (+1.2%): {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
* mqa-decode-b16-ctx4k: fastest 30.7 us; the tree's pick 30.8 us (+0.4%): {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
* serve-mixed-b16-ctx256: fastest 22.6 us; the tree's pick 23.5 us (+3.7%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* serve-mixed-b48-ctx512: fastest 59.6 us; the tree's pick 60.4 us (+1.2%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* serve-mixed-b128-ctx1k: fastest 214.5 us; the tree's pick 214.5 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* serve-chunk-b64-ctx2k: fastest 628.3 us; the tree's pick 628.3 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* mixed-2k: fastest 303.8 us; the tree's pick 303.8 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-512: fastest 20.9 us; the tree's pick 22.8 us (+9.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-2k: fastest 93.3 us; the tree's pick 93.3 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b16-512: fastest 177.7 us; the tree's pick 189.1 us (+6.4%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b4-2k: fastest 343.5 us; the tree's pick 343.5 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* prefill-b1-8k: fastest 1073.8 us; the tree's pick 1073.8 us (+0.0%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
* chunk-b2-2k-ctx6k: fastest 947.2 us; the tree's pick 950.4 us (+0.3%): {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
"""

from attnbench.kernels.bench.tune import features


def choose(shape, platform) -> dict:
    f = features(shape)
    if f['decode_only'] <= 0.5:
        return {'block_m': 128, 'kernel': 'gluon_ws', 'num_warps': 12, 'persistent': True, 'tile_size': 128, 'variant': 'qblock'}
    else:
        if f['kv_programs'] <= 48:
            if f['max_seqlen_k'] <= 2560:
                return {'num_segments': 32, 'variant': 'parallel_tiled'}
            else:
                if f['num_seqs'] <= 2.5:
                    return {'num_segments': 32, 'tile_size': 64, 'variant': 'parallel_tiled'}
                else:
                    return {'num_segments': 16, 'tile_size': 128, 'variant': 'parallel_tiled'}
        else:
            if f['kv_programs'] <= 1536:
                if f['kv_programs'] <= 160:
                    return {'num_segments': 16, 'variant': 'parallel_tiled'}
                else:
                    return {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
            else:
                return {'num_stages': 3, 'tile_size': 128, 'variant': 'qblock'}
