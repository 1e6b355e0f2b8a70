"""What the image builder sends into a build context: the .dockerignore's last matching
line decides, as in Docker, so test helpers excluded after `!trainer/` stay out."""

from pathlib import Path

import pytest

from grpo_testbed import images
from grpo_testbed.images import REPO, ImageError, context_files


def _tree(root: Path, *files: str) -> None:
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)


def test_a_later_exclusion_wins_over_an_earlier_inclusion(tmp_path: Path) -> None:
    _tree(tmp_path, "pkg/a.py", "pkg/testing/helpers.py", "pkg/__pycache__/a.pyc", "other.txt")
    lines = ["*", "!pkg/", "**/__pycache__", "pkg/testing/"]
    got = [p.relative_to(tmp_path).as_posix() for p in context_files(tmp_path, lines)]
    assert got == ["pkg/a.py"]


def test_a_glob_other_than_the_known_ones_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ImageError, match="plain paths only"):
        context_files(tmp_path, ["*", "!pkg/*.py"])


# What each image's build context holds: the shared package, its own side's package, the
# files its Dockerfile copies; never the other side's package, the testbed or test helpers.
SIDES = {"operator": ("api/grpo_api/", "operator/grpo_operator/"),
         "trainer": ("api/grpo_api/", "trainer/grpo_trainer/")}
SOURCE_ROOTS = ("api/", "operator/", "trainer/", "testbed/")


@pytest.mark.parametrize("image", sorted(SIDES))
def test_each_image_gets_only_its_sides_code(image: str) -> None:
    lines = (REPO / "images" / image / "Dockerfile.dockerignore").read_text().splitlines()
    files = [p.relative_to(REPO).as_posix() for p in context_files(REPO, lines)]
    for package in SIDES[image]:
        assert f"{package}__init__.py" in files, package
    sources = {f for f in files if f.startswith(SOURCE_ROOTS)}
    foreign = sorted(f for f in sources if not f.startswith(SIDES[image]))
    assert not foreign, f"the {image} image would get {foreign[:5]}"
    assert not [f for f in files if f.startswith("testkit/grpo_testkit/")]


def test_the_layer_cache_is_pruned_only_when_a_trainer_build_lacks_room() -> None:
    """Untagged images are dropped before a build only on a disk short of its room (a CI
    machine that keeps podman's storage between runs filled its disk with stages a changed
    Dockerfile orphaned); the operator's small build never prunes."""
    gb = 10**9
    assert images.must_prune(10 * gb, images.TRAINER_CPU)
    assert not images.must_prune(40 * gb, images.TRAINER_CPU)
    assert images.must_prune(32 * gb, images.TRAINER_GPU)  # the GPU layer is larger
    assert not images.must_prune(1 * gb, images.OPERATOR)
