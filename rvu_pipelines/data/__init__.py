"""Data set loaders: a local mirror or the public source -> verified files -> polars frames."""

from rvu_pipelines.data.catalog import LoadedDataset, check_counts, load_catalog, load_dataset
from rvu_pipelines.data.sources import (
    DatasetSource,
    MirrorDatasetSource,
    PublicDatasetSource,
    ResolvedFiles,
    default_dataset_source,
)
from rvu_pipelines.data.specs import DatasetCatalog, DatasetSpec

__all__ = [
    "DatasetCatalog",
    "DatasetSource",
    "DatasetSpec",
    "LoadedDataset",
    "MirrorDatasetSource",
    "PublicDatasetSource",
    "ResolvedFiles",
    "check_counts",
    "default_dataset_source",
    "load_catalog",
    "load_dataset",
]
