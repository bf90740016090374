"""Model folders made locally, so that no benchmark needs a model hub.

* `write_tiny_model`: a small Llama (2 layers, hidden 256) with random bf16 weights in
  safetensors and a tokenizer trained here: what `make demo` serves on a CPU.
* `write_dummy_model`: a published architecture's config.json and a local tokenizer, no
  weights. vLLM serves it with ``--load-format dummy`` (random weights of the real shapes),
  so an air-gapped GPU cluster can benchmark serving without downloading weights.

Tokenizers are byte-level BPE trained with the `tokenizers` library on the Python
standard library's sources (always present, no download). Weights come from numpy, so
this module never imports torch.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import sysconfig
import uuid
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# Published config.json values of the architectures (Hugging Face model cards).
_LLAMA31_8B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 131072, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": 128009,
    "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_MISTRAL_SMALL_24B = {
    "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
    "hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
    "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-5, "rope_theta": 100000000.0,
    "sliding_window": None, "vocab_size": 131072, "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
    "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
    "rope_theta": 1000000, "rope_scaling": None, "sliding_window": None,
    "use_sliding_window": False, "attention_bias": False, "vocab_size": 151936,
    "bos_token_id": 151643, "eos_token_id": 151645, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
_QWEN25_7B = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
    "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
    "num_attention_heads": 28, "num_key_value_heads": 4, "max_position_embeddings": 32768,
    "max_window_layers": 28, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "sliding_window": 131072,
    "use_sliding_window": False, "vocab_size": 152064, "bos_token_id": 151643, "eos_token_id": 151645,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
_GEMMA2_9B = {  # head size 256, attention logits capped at 50, every other layer a 4,096-token window
    "architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_act": "gelu_pytorch_tanh",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 3584, "intermediate_size": 14336,
    "num_hidden_layers": 42, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
    "query_pre_attn_scalar": 256, "attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0,
    "sliding_window": 4096, "cache_implementation": "hybrid", "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "attention_bias": False, "vocab_size": 256000,
    "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "torch_dtype": "bfloat16",
}
ARCHS: dict[str, dict] = {
    "llama-3.1-8b": {"source": "meta-llama/Llama-3.1-8B-Instruct", "config": _LLAMA31_8B},
    "mistral-small-24b": {"source": "mistralai/Mistral-Small-24B-Instruct-2501", "config": _MISTRAL_SMALL_24B},
    "qwen3-32b": {"source": "Qwen/Qwen3-32B", "config": {
        **_QWEN3, "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
        "num_attention_heads": 64, "num_key_value_heads": 8, "max_window_layers": 64}},
    "qwen3-8b": {"source": "Qwen/Qwen3-8B", "config": {
        **_QWEN3, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "max_window_layers": 36}},
    "qwen2.5-7b": {"source": "Qwen/Qwen2.5-7B-Instruct", "config": _QWEN25_7B},
    "gemma-2-9b": {"source": "google/gemma-2-9b-it", "config": _GEMMA2_9B},
}

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>\\n' + m['content'] + '\\n' }}"
                 "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")


def _corpus(max_files: int) -> list[str]:
    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))
    if not files:
        raise RuntimeError(f"no Python sources under {stdlib} to train a tokenizer on")
    return files[:max_files]


def train_tokenizer(out_dir: Path, vocab_size: int, model_max_length: int, max_files: int = 120) -> None:
    """Byte-level BPE with ``vocab_size`` ids; specials <s> </s> <pad> take ids 0-2."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(_corpus(max_files), trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "pad_token": "<pad>", "model_max_length": model_max_length, "add_bos_token": True,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))


def write_dummy_model(out_dir: str | Path, arch: str) -> Path:
    """config.json of ``arch`` plus a local 32000-token tokenizer; no weights (serve with
    ``--load-format dummy``). Random weights mostly sample ids past the tokenizer: vLLM
    streams them as empty text and still counts them, so use ignore_eos for fixed lengths."""
    if arch not in ARCHS:
        raise ValueError(f"arch: expected one of {sorted(ARCHS)}, got {arch!r}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = dict(ARCHS[arch]["config"])
    (out / "config.json").write_text(json.dumps(config, indent=2))
    train_tokenizer(out, 32000, config["max_position_embeddings"])
    (out / "attnbench-model.json").write_text(json.dumps(
        {"kind": "dummy", "arch": arch, "source": ARCHS[arch]["source"], "weights": "none (load_format dummy)"}, indent=2))
    return out


TINY = dict(hidden=256, intermediate=512, layers=2, heads=4, kv_heads=2, head_dim=64, vocab=4096, max_len=4096)


def write_tiny_model(out_dir: str | Path, seed: int = 0) -> Path:
    """A 2-layer Llama with random bf16 weights (~7 MB) that vLLM's CPU build can serve."""
    t = TINY
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out, t["vocab"], t["max_len"])
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": t["hidden"], "intermediate_size": t["intermediate"],
        "num_hidden_layers": t["layers"], "num_attention_heads": t["heads"],
        "num_key_value_heads": t["kv_heads"], "head_dim": t["head_dim"],
        "vocab_size": t["vocab"], "max_position_embeddings": t["max_len"], "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    }
    (out / "config.json").write_text(json.dumps(config, indent=2))
    rng = np.random.default_rng(seed)
    h, i, d = t["hidden"], t["intermediate"], t["head_dim"]

    def w(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale)

    weights = {"model.embed_tokens.weight": w(t["vocab"], h), "lm_head.weight": w(t["vocab"], h),
               "model.norm.weight": np.ones(h, np.float32)}
    for layer in range(t["layers"]):
        p = f"model.layers.{layer}."
        weights.update({
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": w(t["heads"] * d, h),
            p + "self_attn.k_proj.weight": w(t["kv_heads"] * d, h),
            p + "self_attn.v_proj.weight": w(t["kv_heads"] * d, h),
            p + "self_attn.o_proj.weight": w(h, t["heads"] * d),
            p + "mlp.gate_proj.weight": w(i, h),
            p + "mlp.up_proj.weight": w(i, h),
            p + "mlp.down_proj.weight": w(h, i),
        })
    save_file({k: _to_bf16_bits(v) for k, v in weights.items()}, str(out / "model.safetensors"))
    _mark_bf16(out / "model.safetensors")
    (out / "attnbench-model.json").write_text(json.dumps(
        {"kind": "tiny", "seed": seed, "weights": "random bf16"}, indent=2))
    return out


def _to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even), as uint16."""
    bits = a.astype(np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def _mark_bf16(path: Path) -> None:
    """safetensors.numpy has no bfloat16: relabel the uint16 tensors as BF16.

    Data offsets in a safetensors header are relative to the end of the header, so the
    header can be rewritten (re-padded to 8 bytes) without touching the data."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for name, entry in header.items():
        if name != "__metadata__" and entry["dtype"] == "U16":
            entry["dtype"] = "BF16"
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n:])


class ModelFolderError(ValueError):
    """A recipe's model folder that cannot be used or made (one line, naming it)."""


def ensure_model(path: str | Path, build: str | None) -> Path:
    """Make the model folder for a recipe's ``model.build`` if it does not exist yet.

    The folder is built beside its final place and renamed into it, so it appears whole:
    several processes that need the same model at once (runs fanned out over the GPUs of
    one host, or Slurm tasks sharing a models folder) never serve one half written, and
    the one that loses the race keeps the winner's."""
    path = Path(path)
    if (path / "config.json").exists() or build is None:
        return path
    half_written = f"model.path: {path} exists but holds no config.json; remove it or name another folder"
    if path.is_dir() and any(path.iterdir()):  # not ours to overwrite
        raise ModelFolderError(half_written)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.parent / f".{path.name}.building-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir()  # the umask's mode, as the model folder will have
    try:
        if build == "tiny":
            write_tiny_model(staging)
        else:
            write_dummy_model(staging, build.split(":", 1)[1])
        try:
            staging.rename(path)  # atomic; onto an empty folder too
        except OSError:  # another process put its folder there first: keep it, if whole
            if not (path / "config.json").exists():
                raise ModelFolderError(half_written) from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return path
