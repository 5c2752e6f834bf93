"""Decoder-only transformers (Llama / Qwen / Gemma 2 / Gemma 3 text; flax nnx), KV cache, logprobs, tokenizers."""

from rlax_post.models._axes import activation_constraints
from rlax_post.models._axes import CACHE_K_LBKHS
from rlax_post.models._axes import CACHE_V_LBKSH
from rlax_post.models._axes import gathers_table
from rlax_post.models._axes import PARAM_LOGICAL_AXES
from rlax_post.models._axes import param_logical_axes
from rlax_post.models._axes import TABLE_VD
from rlax_post.models._config import ModelConfig
from rlax_post.models._config import preset
from rlax_post.models._config import PRESETS
from rlax_post.models._config import round_up
from rlax_post.models._functional import abstract_params
from rlax_post.models._functional import entropy_from_logits
from rlax_post.models._functional import forward
from rlax_post.models._functional import forward_at
from rlax_post.models._functional import init_params
from rlax_post.models._functional import logprobs_from_logits
from rlax_post.models._functional import sequence_values
from rlax_post.models._functional import token_logprobs
from rlax_post.models._functional import token_logprobs_and_values
from rlax_post.models._functional import token_values
from rlax_post.models._functional import unstack_layers
from rlax_post.models._functional import value_model_config
from rlax_post.models._functional import value_model_params
from rlax_post.models._gguf import ARCHITECTURES as GGUF_ARCHITECTURES
from rlax_post.models._gguf import convert_gguf
from rlax_post.models._gguf import TENSOR_TYPES as GGUF_TENSOR_TYPES
from rlax_post.models._hf import ARCHITECTURES as HF_ARCHITECTURES
from rlax_post.models._hf import HF_DTYPES
from rlax_post.models._hf import cast_tensors
from rlax_post.models._hf import config_from_hf
from rlax_post.models._hf import export_hf
from rlax_post.models._hf import hf_architecture
from rlax_post.models._hf import load_hf
from rlax_post.models._hf import read_hf_config
from rlax_post.models._hf import SEQUENCE_CLASSIFIERS
from rlax_post.models._hf_tokenizer import HFTokenizer
from rlax_post.models._hf_tokenizer import render_chat
from rlax_post.models._hf_tokenizer import write_byte_tokenizer
from rlax_post.models._lora import check_lora
from rlax_post.models._lora import init_lora
from rlax_post.models._lora import LoRA
from rlax_post.models._lora import LORA_TARGETS
from rlax_post.models._lora import lora_logical_axes
from rlax_post.models._lora import merge as merge_lora
from rlax_post.models._tokenizer import ByteTokenizer
from rlax_post.models._transformer import cache_axes
from rlax_post.models._transformer import grow_cache
from rlax_post.models._transformer import init_cache
from rlax_post.models._transformer import KVCache
from rlax_post.models._transformer import layer_param_names
from rlax_post.models._transformer import layers_apart
from rlax_post.models._transformer import position_axes
from rlax_post.models._transformer import Transformer

__all__ = [
    "read_hf_config",
    "SEQUENCE_CLASSIFIERS",
    "activation_constraints",
    "CACHE_K_LBKHS",
    "CACHE_V_LBKSH",
    "gathers_table",
    "TABLE_VD",
    "abstract_params",
    "cache_axes",
    "cast_tensors",
    "ByteTokenizer",
    "check_lora",
    "config_from_hf",
    "convert_gguf",
    "export_hf",
    "hf_architecture",
    "entropy_from_logits",
    "forward",
    "forward_at",
    "GGUF_ARCHITECTURES",
    "GGUF_TENSOR_TYPES",
    "HF_ARCHITECTURES",
    "HF_DTYPES",
    "HFTokenizer",
    "grow_cache",
    "init_cache",
    "init_lora",
    "init_params",
    "KVCache",
    "layer_param_names",
    "layers_apart",
    "position_axes",
    "load_hf",
    "write_byte_tokenizer",
    "logprobs_from_logits",
    "LoRA",
    "LORA_TARGETS",
    "lora_logical_axes",
    "merge_lora",
    "ModelConfig",
    "PARAM_LOGICAL_AXES",
    "param_logical_axes",
    "preset",
    "PRESETS",
    "render_chat",
    "round_up",
    "sequence_values",
    "token_logprobs",
    "token_logprobs_and_values",
    "token_values",
    "unstack_layers",
    "value_model_config",
    "value_model_params",
    "Transformer",
]
