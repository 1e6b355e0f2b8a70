"""spec.hub.endpoint against the platform's hub endpoints (pure; reconcile, admission and
`grpo plan` resolve it here).

The platform owns the URLs: the chart's `hubEndpoints` (`--hub-endpoints`) maps names to
hub URLs (a mirror, a proxy); a tenant's job names one. Every place that reads a job's
hub (the operator's GET of config.json, the reader pod, the head pod's fetch through
HF_ENDPOINT) gets the listed URL, so no tenant can make the operator, or a pod it
creates, GET an address of the tenant's choosing from inside the cluster (SSRF). A URL in
the spec is accepted only when it is one of the listed URLs, so manifests written with
the mirror's URL keep working where the platform lists that mirror.

`grpo plan` runs on the user's own machine: it takes any URL, and a name from the
`--hub-endpoints` it is given.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from grpo_api.job import SpecError
from grpo_api.job.hub import HUB_NAME_PATTERN, HUB_URL_PATTERN

FLAG = "--hub-endpoints"
FIELD = "spec.hub.endpoint"
NAME = re.compile(HUB_NAME_PATTERN)  # what a tenant writes: the chart's value keys
URL = re.compile(HUB_URL_PATTERN)
EXAMPLE = '{"mirror": "https://hf-mirror.internal"}'
NO_HUB_ENDPOINTS: Mapping[str, str] = MappingProxyType({})  # the default: none listed


def parse_hub_endpoints(text: str) -> dict[str, str]:
    """The flag's JSON object, {name: URL, ...}; ValueError naming the key and the fix."""
    try:
        raw = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{FLAG}: not JSON ({err}); give an object such as {EXAMPLE}"
                         ) from None
    if not isinstance(raw, dict):
        raise ValueError(f"{FLAG}: a JSON object of names to URLs is needed, got "
                         f"{type(raw).__name__}; for example {EXAMPLE}")
    for name, url in raw.items():
        if not NAME.match(name):
            raise ValueError(f"{FLAG}: name {name!r} is not a DNS label (lower-case letters, "
                             "digits and '-'); tenants write it in spec.hub.endpoint")
        if not isinstance(url, str) or not URL.match(url):
            raise ValueError(f"{FLAG}: {name}: {url!r} is not an http(s) URL; for example "
                             f"{EXAMPLE}")
    return dict(raw)


def endpoint_url(endpoint: str | None, listed: Mapping[str, str],
                 any_url: bool = False) -> str | None:
    """The hub URL spec.hub.endpoint stands for (None: not set, the public hub). Raises
    SpecError naming the field and the fix for a name or URL the platform does not list
    (`any_url`: a URL is taken as it is, as on the user's own machine)."""
    if endpoint is None:
        return None
    if endpoint in listed:
        return listed[endpoint]
    is_url = bool(URL.match(endpoint))
    if is_url and (any_url or endpoint.rstrip("/") in {u.rstrip("/") for u in listed.values()}):
        return endpoint
    names = ", ".join(sorted(listed))
    if any_url:
        fix = (f"give grpo plan the cluster's list with {FLAG} (for example "
               f"{FLAG} '{{\"{endpoint}\": \"https://...\"}}'), or write the hub's URL")
        raise SpecError([f"{FIELD}: {endpoint!r} names one of a cluster's hub endpoints, "
                         f"which this command does not know. Fix: {fix}"])
    what = "URL" if is_url else "name"
    if names:
        fix = (f"set {FIELD} to one of {names}, or ask the platform team to add this hub "
               "to the chart's hubEndpoints")
    else:
        fix = (f"remove {FIELD} (jobs then read the public hub where the chart allows it, "
               "readPublicHub), or ask the platform team to list this hub in the chart's "
               "hubEndpoints")
    listed_words = f"the cluster's hub endpoints ({names})" if names else (
        "the cluster's hub endpoints (it lists none)")
    raise SpecError([f"{FIELD}: the {what} {endpoint!r} is not one of {listed_words}: "
                     f"the operator reads no hub a job names unless the platform lists it. "
                     f"Fix: {fix}"])


def with_endpoint_url(raw_spec: dict[str, Any], listed: Mapping[str, str],
                      any_url: bool = False) -> dict[str, Any]:
    """`raw_spec` (the spec as stored) with spec.hub.endpoint as the URL it stands for;
    the same dict when it names none. Raises SpecError as endpoint_url."""
    hub = raw_spec.get("hub")
    if not isinstance(hub, dict) or not isinstance(hub.get("endpoint"), str):
        return raw_spec  # unset, or not a string: the spec's own parse says so
    endpoint = hub["endpoint"]
    url = endpoint_url(endpoint, listed, any_url)
    return raw_spec if url == endpoint else {**raw_spec, "hub": {**hub, "endpoint": url}}


def readable(raw_spec: dict[str, Any], listed: Mapping[str, str]) -> dict[str, Any] | None:
    """with_endpoint_url's spec, for the edges that read a hub before deciding; None: it
    names a hub the platform does not list, which nobody reads (the decision refuses it)."""
    try:
        return with_endpoint_url(raw_spec, listed)
    except SpecError:
        return None
