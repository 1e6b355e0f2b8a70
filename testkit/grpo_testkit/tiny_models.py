"""The tiny model builders, under the name the tests import them by; they ship in the
trainer image as grpo_trainer.tiny.models (`grpo-train make-tiny` runs them there)."""

from grpo_trainer.tiny.models import VL_FAMILIES as VL_FAMILIES
from grpo_trainer.tiny.models import build_tiny_qwen2 as build_tiny_qwen2
from grpo_trainer.tiny.models import build_tiny_qwen2_5_vl as build_tiny_qwen2_5_vl
from grpo_trainer.tiny.models import build_tiny_vl as build_tiny_vl
from grpo_trainer.tiny.models import build_tokenizer as build_tokenizer
from grpo_trainer.tiny.models import save_vl_processor as save_vl_processor
