"""spec.hub: how the operator fetches hub models and datasets named in the spec."""

from __future__ import annotations

from pydantic import Field

from .base import ApiModel

# A hub endpoint's name, as the platform lists it (the chart's hubEndpoints keys: a DNS
# label), and its URL; spec.hub.endpoint holds either.
HUB_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
HUB_URL_PATTERN = r"^https?://[^\s/]+(/\S*)?$"


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
        None,
        pattern=f"^({HUB_NAME_PATTERN[1:-1]}|{HUB_URL_PATTERN[1:-1]})$",
        description="A hub other than the public one (a mirror, a proxy), by the name the "
        "platform gave it in the chart's hubEndpoints; a URL is accepted only where it is "
        "one of those (the operator reads no other). The pods get it as HF_ENDPOINT.",
    )
