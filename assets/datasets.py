"""One asset per data set (parquet via polars) with a blocking check of its published row counts."""

import polars as pl
from dagster import (
    AssetCheckResult,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetsDefinition,
    MetadataValue,
    Output,
    TableColumn,
    TableSchema,
    asset,
)

from resources import DatasetSourceResource
from rvu_pipelines.code_closure import code_version_of
from rvu_pipelines.data import check_counts, load_catalog, load_dataset
from rvu_pipelines.data.agentdojo_suites import check_suite_counts, installed_agentdojo_version, load_agentdojo_suites
from rvu_pipelines.data.catalog import observed_group_counts
from rvu_pipelines.data.specs import DatasetSpec
from rvu_pipelines.reporting import markdown_table

CODE_VERSION = code_version_of(__name__)  # the code this module's assets run (code_closure)

GROUP = "datasets"
COUNT_CHECK = "published_row_counts"


def _schema(frame: pl.DataFrame) -> TableSchema:
    return TableSchema(columns=[TableColumn(name, str(dtype)) for name, dtype in frame.schema.items()])


def _count_check(spec: DatasetSpec, frame: pl.DataFrame) -> AssetCheckResult:
    problems = check_counts(spec, frame)
    observed = {"rows": frame.height}
    for group in spec.group_counts:
        observed["/".join(group.by)] = observed_group_counts(frame, group.by)  # type: ignore[assignment]
    return AssetCheckResult(
        check_name=COUNT_CHECK,
        passed=not problems,
        metadata={
            "expected_rows": spec.rows,
            "observed": MetadataValue.json(observed),
            "mismatches": MetadataValue.json([str(p) for p in problems]),
        },
    )


def build_dataset_asset(spec: DatasetSpec) -> AssetsDefinition:
    @asset(
        code_version=CODE_VERSION,
        name=spec.name,
        group_name=GROUP,
        description=f"{spec.title}. {spec.description} Licence {spec.licence}. "
        f"Public source: {spec.public.describe()}.",
        kinds={"polars", "parquet"},
        check_specs=[
            AssetCheckSpec(
                COUNT_CHECK,
                asset=spec.name,
                blocking=True,
                description="Row counts equal the published ones (configs/datasets.yaml).",
            )
        ],
    )
    def _dataset(context: AssetExecutionContext, data_source: DatasetSourceResource):
        loaded = load_dataset(spec, data_source.build())
        frame = loaded.frame
        context.log.info(f"{spec.name}: {frame.height} rows from {loaded.resolved.origin}")
        yield Output(
            frame,
            metadata={
                "dagster/row_count": frame.height,
                "dagster/column_schema": _schema(frame),
                "rows": frame.height,
                "columns": MetadataValue.json(frame.columns),
                "source": loaded.resolved.origin,
                "public_source": spec.public.describe(),
                "licence": spec.licence,
                "sha256": MetadataValue.json(loaded.resolved.sha256),
                "sha256_verified": MetadataValue.json(loaded.resolved.verified),
                "preview": MetadataValue.md(markdown_table(frame, max_rows=5)),
            },
        )
        yield _count_check(spec, frame)

    return _dataset


def _agentdojo_asset() -> AssetsDefinition:
    spec = load_catalog().agentdojo

    @asset(
        code_version=CODE_VERSION,
        name="agentdojo_suites",
        group_name=GROUP,
        description=f"AgentDojo task suites ({spec.benchmark_version}) read from the installed agentdojo package: "
        f"user and injection tasks per suite. Licence {spec.licence}. Source: {spec.url}.",
        kinds={"polars", "parquet"},
        check_specs=[
            AssetCheckSpec(
                COUNT_CHECK,
                asset="agentdojo_suites",
                blocking=True,
                description="User / injection task counts per suite match the pinned version.",
            )
        ],
    )
    def agentdojo_suites(context: AssetExecutionContext):
        frame = load_agentdojo_suites(spec)
        problems = check_suite_counts(spec, frame)
        yield Output(
            frame,
            metadata={
                "dagster/row_count": frame.height,
                "source": f"package:agentdojo=={installed_agentdojo_version()}",
                "benchmark_version": spec.benchmark_version,
                "licence": spec.licence,
                "suites": MetadataValue.md(markdown_table(frame)),
                "user_tasks": int(frame["user_tasks"].sum()),
                "injection_tasks": int(frame["injection_tasks"].sum()),
            },
        )
        yield AssetCheckResult(
            check_name=COUNT_CHECK,
            passed=not problems,
            metadata={"mismatches": MetadataValue.json([str(p) for p in problems])},
        )

    return agentdojo_suites


def dataset_assets() -> list[AssetsDefinition]:
    catalog = load_catalog()
    return [build_dataset_asset(spec) for _, spec in sorted(catalog.datasets.items())] + [_agentdojo_asset()]
