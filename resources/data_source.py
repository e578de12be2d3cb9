from dagster import ConfigurableResource
from pydantic import Field

from rvu_pipelines.data.sources import (
    DatasetSource,
    MirrorDatasetSource,
    PublicDatasetSource,
    dataset_source_from_env,
)


class DatasetSourceResource(ConfigurableResource):
    """Where data sets are read from: a mirror folder, else the public sources.

    Leave `mirror` unset to follow the RVU_DATA_MIRROR environment variable (the embedded default).
    """

    mirror: str | None = Field(default=None, description="Mirror folder; overrides RVU_DATA_MIRROR.")
    offline: bool = Field(default=False, description="Never reach the network on the public path.")

    def build(self) -> DatasetSource:
        if self.mirror:
            return MirrorDatasetSource(self.mirror)  # type: ignore[arg-type]
        source = dataset_source_from_env()
        if self.offline and isinstance(source, PublicDatasetSource):
            source.offline = True
        return source
