"""checkpoint.store in the trainer's config and its pure parts: the URI, the backoff, the
refusals that must not be retried."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from grpo_api.trainer_config import CheckpointConfig, ObjectStoreConfig
from grpo_trainer.object_store import (
    BACKOFF_CAP_S,
    StoreRefused,
    backoff_s,
    parse_uri,
)

pytestmark = pytest.mark.unit


def test_a_uri_names_the_bucket_and_a_prefix_without_slashes() -> None:
    loc = parse_uri("s3://ckpt-bucket/jobs/team-a/run-7/")
    assert (loc.bucket, loc.prefix) == ("ckpt-bucket", "jobs/team-a/run-7")
    assert str(loc) == "s3://ckpt-bucket/jobs/team-a/run-7"
    assert parse_uri("s3://ckpt-bucket").prefix == ""
    with pytest.raises(ValueError, match="not an s3:// URI"):
        parse_uri("gs://ckpt-bucket/x")


@pytest.mark.parametrize("uri", ["s3://A_Bucket/x", "s3:///x", "/checkpoints", "s3://ab"])
def test_a_bad_store_uri_is_refused_naming_the_field(uri: str) -> None:
    with pytest.raises(ValidationError, match="uri"):
        ObjectStoreConfig(uri=uri)


def test_a_store_needs_the_local_staging_dir() -> None:
    with pytest.raises(ValidationError, match=r"checkpoint\.store needs checkpoint\.dir"):
        CheckpointConfig(store=ObjectStoreConfig(uri="s3://ckpt/x"))
    ok = CheckpointConfig(dir="/staging", store=ObjectStoreConfig(uri="s3://ckpt/x"))
    assert ok.store is not None and ok.store.upload_deadline_s == 1800.0


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert [backoff_s(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert backoff_s(40) == BACKOFF_CAP_S


def test_a_refusal_names_the_secret_and_never_the_keys() -> None:
    cfg = ObjectStoreConfig(uri="s3://ckpt/x", endpoint="http://s3.internal:9000",
                            keys_secret="team-a-s3")
    err = StoreRefused(cfg, "refused to upload latest", "403 Forbidden")
    assert "Secret 'team-a-s3'" in str(err) and "http://s3.internal:9000" in str(err)
    assert err.field == "checkpoint.store"
    anonymous = StoreRefused(ObjectStoreConfig(uri="s3://ckpt/x"), "refused to list", "403")
    assert "AWS_ACCESS_KEY_ID, or the pod's identity" in str(anonymous)
