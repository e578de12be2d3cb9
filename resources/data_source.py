"""Where data sets come from: one interface, a mirror folder or the public sources; a deployment picks one."""

from abc import ABC, abstractmethod
from dataclasses import replace
from pathlib import Path

from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.data.sources import DatasetSource, PublicDatasetSource, mirror_source
from rvu_pipelines.paths import public_sources


class DatasetSourceResource(ConfigurableResource, ABC):
    """The data set source the dataset assets read through (``resources.deployments`` binds one)."""

    @abstractmethod
    def build(self) -> DatasetSource:
        """The library's source object, ready to resolve data set specs."""


class MirrorDatasetSourceResource(DatasetSourceResource):
    """A local mirror folder laid out like ``../shared/data`` (sha256-verified; never the network)."""

    mirror: str = Field(description="The mirror folder (RVU_DATA_MIRROR in the shipped deployments).")

    def build(self) -> DatasetSource:
        return mirror_source(self.mirror)


class PublicDatasetSourceResource(DatasetSourceResource):
    """The canonical public sources (HF datasets, GitHub at pinned commits, PyPI), cached under .rvu/."""

    offline: bool | None = Field(
        default=None, description="True: use the cache only and fail fast; default: RVU_OFFLINE / HF_HUB_OFFLINE."
    )
    cache_root: str | None = Field(default=None, description="Cache folder; default .rvu/cache/datasets")

    def build(self) -> DatasetSource:
        public = public_sources()
        if self.offline is not None:
            public = replace(public, offline=self.offline)
        return PublicDatasetSource(cache_root=Path(self.cache_root) if self.cache_root else None, public=public)
