"""The built image (``make image``) and its unpacked root file system, once per session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.testbed.product_image import ProductImage, ProductImageError


@pytest.fixture(scope="session")
def image() -> ProductImage:
    try:
        return ProductImage.load()
    except ProductImageError as exc:
        pytest.fail(f"the image is not built: {exc}")


@pytest.fixture(scope="session")
def image_files(image: ProductImage) -> dict[str, str]:
    return image.files()


@pytest.fixture(scope="session")
def rootfs(image: ProductImage, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = image.unpack(tmp_path_factory.mktemp("image") / "rootfs")
    yield root
