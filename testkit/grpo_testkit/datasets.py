"""The tiny dataset writers, under the name the tests import them by; they ship in the
trainer image as grpo_trainer.tiny.data (`grpo-train make-tiny` runs them there)."""

from grpo_trainer.tiny.data import NOT_AN_IMAGE as NOT_AN_IMAGE
from grpo_trainer.tiny.data import png as png
from grpo_trainer.tiny.data import write_mixed_task as write_mixed_task
from grpo_trainer.tiny.data import write_text_task as write_text_task
from grpo_trainer.tiny.data import write_vision_task as write_vision_task
from grpo_trainer.tiny.data import write_with_corrupt_image as write_with_corrupt_image
