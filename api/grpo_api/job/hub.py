"""spec.hub: how the operator fetches hub models and datasets named in the spec."""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel


class HubSpec(ApiModel):
    """Hub access for `model.path` / `data.train` / `data.val` that name hub repos: they are
    fetched once per job onto the checkpoint volume by an init container of the head pod,
    before any rank starts; progress is the HubFetch condition."""

    token_secret: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="Secret holding HF_TOKEN (gated or private repos), in tokenKey.",
    )
    token_key: str = Field("token", min_length=1, description="Key of tokenSecret.")
    endpoint: str | None = Field(
        None, pattern=r"^https?://", description="Hub endpoint (HF_ENDPOINT), e.g. a mirror."
    )
